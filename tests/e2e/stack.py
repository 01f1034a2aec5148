"""The product's real processes for end-to-end tests: redis, daphne, inference workers and,
for the tests that need them, Celery workers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg
from psycopg.rows import dict_row

from tests.database_plugin import postgres_server
from tests.processes import ROOT, RedisServer, child_env, daphne, free_port, manage, stop


class Stack:
    def __init__(self, workdir: Path, **settings_env: str) -> None:
        self.workdir = workdir
        self.redis = RedisServer(workdir / "redis")
        # A database of its own: a file on SQLite runs, one on the suite's PostgreSQL otherwise.
        self.postgres = postgres_server()
        self.db_path = workdir / "db.sqlite3"
        self.postgres_database = ""
        self.port = free_port()
        self.settings_env = settings_env
        self.web: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.celery_workers: list[subprocess.Popen] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def database_url(self) -> str:
        if self.postgres is not None:
            return self.postgres.url(self.postgres_database)
        return f"sqlite:///{self.db_path}"

    @property
    def env(self) -> dict[str, str]:
        return child_env(REDIS_URL=self.redis.url, DATABASE_URL=self.database_url, **self.settings_env)

    def start(self, *, worker: bool = True) -> None:
        self.redis.start()
        if self.postgres is not None:
            self.postgres_database = self.postgres.create_database("e2e")
        for command in (["migrate", "--no-input", "-v0"], ["seed_demo"]):
            returncode = manage(*command, env=self.env, stdout=subprocess.DEVNULL).wait()
            assert returncode == 0, f"manage.py {command[0]} failed"
        self.web = daphne(self.port, self.env, self.workdir / "web.log")
        if worker:
            self.start_worker()

    def start_worker(self, **extra_env: str) -> subprocess.Popen:
        log = open(self.workdir / f"worker-{len(self.workers)}.log", "ab")  # noqa: SIM115
        worker = manage(
            "runworker", "inference", env={**self.env, **extra_env}, stdout=log, stderr=subprocess.STDOUT
        )
        self.workers.append(worker)
        self.wait_ready()
        return worker

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base_url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"the stack was not ready after {timeout_s}s; see logs in {self.workdir}")

    def kill_worker(self, worker: subprocess.Popen) -> None:
        stop(worker, signal.SIGKILL)

    def start_celery(self, *, beat: bool = True, timeout_s: float = 60.0) -> subprocess.Popen:
        """A Celery worker (threads pool), with beat for the periodic tasks unless told not to."""
        log_path = self.workdir / f"celery-{len(list(self.workdir.glob('celery-*.log')))}.log"
        command = [
            sys.executable, "-m", "celery", "-A", "config", "worker",
            "--pool", "threads", "--concurrency", "4", "--loglevel", "INFO",
            "--without-heartbeat", "--without-mingle", "--without-gossip",
        ]  # fmt: skip
        if beat:
            command += ["--beat", "--schedule", str(self.workdir / "celerybeat-schedule")]
        with open(log_path, "ab") as log:
            # Its own process group: killing it takes beat's child process along.
            celery = subprocess.Popen(
                command, env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.celery_workers.append(celery)
        deadline = time.monotonic() + timeout_s
        while b" ready." not in log_path.read_bytes():
            if celery.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Celery worker did not start; see {log_path}")
            time.sleep(0.1)
        return celery

    def kill_celery(self, celery: subprocess.Popen) -> None:
        """A crash: the worker and its beat die at once, without handing anything on."""
        os.killpg(celery.pid, signal.SIGKILL)
        celery.wait()
        self.celery_workers.remove(celery)

    def create_api_key(self, username: str, *, tier: str = "") -> str:
        """Issue an API key with `manage.py apikey create`; returns the key."""
        command = ["apikey", "create", "--user", username, *(["--tier", tier] if tier else [])]
        process = manage(*command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        out, _ = process.communicate()
        assert process.returncode == 0, "manage.py apikey create failed"
        return out.decode().strip()

    def stop(self) -> None:
        for celery in self.celery_workers:
            stop(celery)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(celery.pid, signal.SIGKILL)  # whatever of its group outlived it
        for worker in self.workers:
            stop(worker)
        if self.web is not None:
            stop(self.web)
        self.redis.stop()
        if self.postgres is not None and self.postgres_database:
            self.postgres.drop_database(self.postgres_database)

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
        """(status, content) of every stored message for the request, read from the database."""
        rows = self.db_rows(
            "SELECT status, content FROM chat_message WHERE request_id = %s", (self.db_uuid(request_id),)
        )
        return [(row["status"], row["content"]) for row in rows]
