"""The product's real processes for end-to-end tests: redis, daphne and inference workers."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import httpx

from tests.processes import RedisServer, child_env, daphne, free_port, manage, stop


class Stack:
    def __init__(self, workdir: Path, **settings_env: str) -> None:
        self.workdir = workdir
        self.redis = RedisServer(workdir / "redis")
        self.db_path = workdir / "db.sqlite3"
        self.port = free_port()
        self.settings_env = settings_env
        self.web: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return child_env(
            REDIS_URL=self.redis.url,
            DATABASE_URL=f"sqlite:///{self.db_path}",
            **self.settings_env,
        )

    def start(self, *, worker: bool = True) -> None:
        self.redis.start()
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

    def stop(self) -> None:
        for worker in self.workers:
            stop(worker)
        if self.web is not None:
            stop(self.web)
        self.redis.stop()

    def count_assistant_messages(self, request_id: str) -> list[tuple[str, str]]:
        """(status, content) of every stored message for the request, read from the database."""
        import sqlite3

        with sqlite3.connect(self.db_path) as db:
            return db.execute(
                "SELECT status, content FROM chat_message WHERE request_id = ?",
                (request_id.replace("-", ""),),
            ).fetchall()
