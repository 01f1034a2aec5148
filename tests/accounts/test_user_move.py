"""The account model moved from chat to accounts: a database made by the release before the
move migrates with plain `manage.py migrate`, on SQLite and PostgreSQL, and its accounts sign in
and own what they owned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command

from tests.database_plugin import postgres_server

# Each test migrates a database of its own, of the suite's kind (SQLite or PostgreSQL).
pytestmark = pytest.mark.database

ROOT = Path(__file__).resolve().parents[2]
SECRETS = {"username": "alice", "password": "correct horse battery", "api_key": "sk-moved-with-its-owner"}


@pytest.fixture
def database_url(tmp_path: Path) -> Iterator[str]:
    """An empty database of the suite's kind, apart from the test database."""
    postgres = postgres_server()
    if postgres is None:
        yield f"sqlite:///{tmp_path / 'db.sqlite3'}"
        return
    name = postgres.create_database("user_move")
    try:
        yield postgres.url(name)
    finally:
        postgres.drop_database(name)


def _run(command: list[str], database_url: str, stdin: str = "") -> str:
    done = subprocess.run(
        [sys.executable, *command],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url, "DJANGO_SETTINGS_MODULE": "config.settings"},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _step(step: str, database_url: str) -> dict:
    return json.loads(_run(["-m", "tests.accounts.user_move_steps", step], database_url, json.dumps(SECRETS)))


def test_an_account_made_before_the_move_signs_in_and_owns_its_rows_after_migrate(database_url):
    before = _step("before", database_url)

    migrated = _run(["manage.py", "migrate", "--no-input"], database_url)

    assert "Recorded accounts.0001_initial as applied" in migrated
    assert "Applying chat.0009_user_moved_to_accounts... OK" in migrated
    after = _step("after", database_url)
    assert after == {
        "user": before["user"],
        "tier": "vip",
        "conversations": [before["conversation"]],
        "messages": ["Hello"],
        "api_key": before["api_key"],
        "api_key_owner": before["user"],
        "can_change_accounts": True,
    }
    assert "No planned migration operations." in _run(["manage.py", "migrate", "--plan"], database_url)


def test_a_new_database_migrates_without_recording_anything(database_url):
    migrated = _run(["manage.py", "migrate", "--no-input"], database_url)

    assert "Recorded" not in migrated
    assert "Applying accounts.0001_initial... OK" in migrated


@pytest.mark.django_db
def test_the_models_and_their_migrations_agree():
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)
