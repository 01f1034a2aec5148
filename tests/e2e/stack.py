"""The product's real processes for end-to-end tests: redis, daphne, inference workers and,
for the tests that need them, Celery workers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.processes import ROOT, RedisServer, child_env, daphne, free_port, manage, stop


class Stack:
    def __init__(self, workdir: Path, **settings_env: str) -> None:
        self.workdir = workdir
        self.redis = RedisServer(workdir / "redis")
        self.db_path = workdir / "db.sqlite3"
        self.port = free_port()
        self.settings_env = settings_env
        self.web: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.celery_workers: list[subprocess.Popen] = []

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

    def start_celery(
        self, *, beat: bool = True, queues: str = "celery,batch-jobs", timeout_s: float = 60.0
    ) -> subprocess.Popen:
        """A Celery worker (threads pool), with beat for the periodic tasks unless told not to;
        it consumes the default queue and the batch jobs' unless given `queues`."""
        log_path = self.workdir / f"celery-{len(list(self.workdir.glob('celery-*.log')))}.log"
        command = [
            sys.executable, "-m", "celery", "-A", "config", "worker", "--queues", queues,
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

    def count_assistant_messages(self, request_id: str) -> list[tuple[str, str]]:
        """(status, content) of every stored message for the request, read from the database."""
        import sqlite3

        with sqlite3.connect(self.db_path) as db:
            return db.execute(
                "SELECT status, content FROM chat_message WHERE request_id = ?",
                (request_id.replace("-", ""),),
            ).fetchall()
