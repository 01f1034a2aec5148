"""Pytest plugin: the database the suite runs on, `--database sqlite` (default) or `postgres`.

With `postgres` a private PostgreSQL cluster starts before Django reads its settings and
DATABASE_URL points at it; pytest-django then creates and drops its test database there, and
each end-to-end stack creates and drops a database of its own (tests/e2e/stack.py).

Every test that reaches a database gets the marker `database`: those that ask for Django's test
database (pytest-django's marker or fixtures) and the end-to-end tests; a test that reaches one
of its own says so with the marker. The others cannot tell SQLite from PostgreSQL (pytest-django
refuses them the database), so `make test` runs only these on PostgreSQL.

The help center's embedding store (knowledge.embedding.PassageStore, a cache beside the
database) is the suite's own, var/test-embeddings.sqlite3, shared by the suite's process and
every stack it starts and kept between runs: a text's vector is the same whichever run embedded
it, so the demo help center is embedded once, not once a stack or a run (EMBEDDING_STORE_PATH
names another; empty, none).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from launcher.postgres import PostgresServer
from launcher.process import ROOT

_postgres: PostgresServer | None = None
EMBEDDING_STORE = ROOT / "var" / "test-embeddings.sqlite3"

# pytest-django's fixtures that open Django's test database to a test.
_DATABASE_FIXTURES = {
    "db",
    "transactional_db",
    "django_db_reset_sequences",
    "django_db_serialized_rollback",
    "live_server",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--database",
        choices=("sqlite", "postgres"),
        default="sqlite",
        help="run the suite on SQLite (as `make run`) or on a private PostgreSQL (as production)",
    )


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config, parser, args):
    global _postgres
    os.environ.setdefault("EMBEDDING_STORE_PATH", str(EMBEDDING_STORE))
    if early_config.known_args_namespace.database == "postgres":
        try:
            _postgres = PostgresServer(Path(tempfile.mkdtemp(prefix="test-postgres-")))
        except RuntimeError as exc:  # PostgreSQL is not installed: one line says so
            raise pytest.UsageError(str(exc)) from None
        _postgres.start()
        os.environ["DATABASE_URL"] = _postgres.url("support_chat")
        # The suite's process outlives many event loops, and each async test's executor thread
        # keeps the pooled connection it used until that thread ends (a web process has a few
        # such threads, the suite has one per async test): a larger pool than a web process's
        # leaves room for the concurrent-post tests' eight at once, which a loaded machine also
        # opens slowly.
        os.environ.setdefault("DATABASE_POOL_SIZE", "60")
        os.environ.setdefault("DATABASE_POOL_TIMEOUT_S", "60")
    else:
        # The unit tests' database is SQLite in memory; e2e stacks make their own files.
        os.environ.pop("DATABASE_URL", None)
    return (yield)


def pytest_itemcollected(item: pytest.Item) -> None:
    reaches_database = (
        item.get_closest_marker("django_db") is not None
        or item.get_closest_marker("e2e") is not None
        or not _DATABASE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))
    )
    if reaches_database:
        item.add_marker(pytest.mark.database)


def pytest_report_header(config: pytest.Config) -> str:
    return f"database: {config.getoption('database')}"


def pytest_unconfigure(config):
    if _postgres is not None:
        _postgres.stop()


def postgres_server() -> PostgresServer | None:
    """The private PostgreSQL of a `--database postgres` run; None on SQLite."""
    return _postgres
