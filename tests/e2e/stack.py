"""The product as real processes (launcher.stack), with what the end-to-end tests read back:
the stack's own database, on SQLite or on the suite's PostgreSQL (`--database postgres`)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

from launcher import stack
from tests.database_plugin import postgres_server


class Stack(stack.Stack):
    def __init__(self, workdir: Path, **settings_env: str) -> None:
        super().__init__(workdir, **settings_env)
        # A database of its own: a file on SQLite runs, one on the suite's PostgreSQL otherwise.
        self.postgres = postgres_server()
        self.postgres_database = ""

    @property
    def database_url(self) -> str:
        if self.postgres is not None:
            return self.postgres.url(self.postgres_database)
        return super().database_url

    def start(self, *, worker: bool = True) -> None:
        if self.postgres is not None and not self.postgres_database:
            self.postgres_database = self.postgres.create_database("e2e")
        super().start(worker=worker)

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self.postgres is not None and self.postgres_database:
                self.postgres.drop_database(self.postgres_database)
                self.postgres_database = ""

    def db_rows(self, sql: str, params: tuple = ()) -> list[dict]:
        """Rows of a query on the stack's database, as dicts; `%s` marks a parameter.

        Values come back as each database stores them: SQLite gives datetimes and JSON as text
        and UUIDs as 32 hex digits; db_uuid(), db_time() and db_json() bridge that.
        """
        if self.postgres is not None:
            with psycopg.connect(self.database_url, row_factory=dict_row) as db:
                return db.execute(sql, params).fetchall()
        with contextlib.closing(sqlite3.connect(self.db_path)) as db:
            db.row_factory = sqlite3.Row
            return [dict(row) for row in db.execute(sql.replace("%s", "?"), params)]

    def db_uuid(self, value: str) -> object:
        """A UUID as a query parameter, in the form the stack's database stores it."""
        return uuid.UUID(value) if self.postgres is not None else uuid.UUID(value).hex

    @staticmethod
    def db_time(value: datetime | str) -> datetime:
        """A stored datetime as an aware one (SQLite returns Django's UTC text)."""
        if isinstance(value, datetime):
            return value
        return datetime.fromisoformat(value).replace(tzinfo=UTC)

    @staticmethod
    def db_json(value: object) -> object:
        """A stored JSON value, parsed (SQLite returns the text)."""
        return json.loads(value) if isinstance(value, str) else value

    def count_assistant_messages(self, request_id: str) -> list[tuple[str, str]]:
        """(status, text) of every stored answer for the request, read from the database."""
        rows = self.db_rows(
            "SELECT g.status, g.text FROM chat_message m JOIN scheduler_generation g"
            " ON g.request_id = m.request_id WHERE m.request_id = %s",
            (self.db_uuid(request_id),),
        )
        return [(row["status"], row["text"]) for row in rows]
