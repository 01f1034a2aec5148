"""The whole product on free ports in a scratch directory: a private Redis, a SQLite database,
daphne, inference workers and, when asked, Celery workers. The end-to-end tests and the
benchmarks start the product with it; `make run` starts the same processes its own way."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx

from config.env import env_float  # a plain reader: no settings are loaded
from launcher.process import ROOT, Process, free_port, stop_in_order, wait_for_port
from launcher.redis import RedisServer

PYTHON = sys.executable
# A worker told to stop finishes what it generates first (WORKER_DRAIN_TIMEOUT_S, 30 s by
# default); past its termination grace (the drain timeout and a margin) it is killed.
WORKER_STOP_TIMEOUT_S = env_float("WORKER_TERMINATION_GRACE_S", 40.0)


def manage_command(*args: str) -> list[str]:
    return [PYTHON, str(ROOT / "manage.py"), *args]


def celery_command(*, queues: str, concurrency: int, pool: str = "prefork") -> list[str]:
    """A Celery worker of this project consuming `queues` (comma-separated). Worker events
    (heartbeat, mingle, gossip) retry Redis for ever: without them a stop never waits on Redis."""
    return [
        PYTHON, "-m", "celery", "-A", "config", "worker", "--queues", queues,
        "--pool", pool, "--concurrency", str(concurrency), "--loglevel", "INFO",
        "--without-heartbeat", "--without-mingle", "--without-gossip",
    ]  # fmt: skip


# Connections the kernel holds for daphne until it accepts them. Twisted's default is 50: a
# burst of hundreds of customers connecting at once overflowed it, and the kernel then reset
# connections whose requests were already sent (the client saw the connection closed with no
# answer). The kernel caps it at net.core.somaxconn.
WEB_LISTEN_BACKLOG = 1024


def web_command(host: str, port: int) -> list[str]:
    interface = host.strip("[]").replace(":", "\\:")
    endpoint = f"tcp:port={port}:interface={interface}:backlog={WEB_LISTEN_BACKLOG}"
    return [PYTHON, "-m", "daphne", "-e", endpoint, "config.asgi:application"]


def worker_command() -> list[str]:
    return manage_command("runworker", "inference")


def inherited_env(**overrides: str) -> dict[str, str]:
    """Our environment for a child, without pytest's variables (a child is not a test)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(overrides)
    return env


class Stack:
    def __init__(self, workdir: Path, **settings_env: str) -> None:
        self.workdir = workdir
        self.redis = RedisServer(workdir / "redis", output=workdir / "redis.log")
        self.db_path = workdir / "db.sqlite3"
        # The demo staff account's password: made at random, as for a real demo.
        self.staff_password = secrets.token_urlsafe(12)
        self.port = free_port()
        self.settings_env = settings_env
        self.web: Process | None = None
        self.workers: list[Process] = []
        self.celery_workers: list[Process] = []
        self._logs = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def database_url(self) -> str:
        return f"sqlite:///{self.db_path}"

    @property
    def env(self) -> dict[str, str]:
        return inherited_env(REDIS_URL=self.redis.url, DATABASE_URL=self.database_url, **self.settings_env)

    def _log(self, role: str) -> Path:
        self._logs += 1
        return self.workdir / f"{role}-{self._logs}.log"

    def start(self, *, worker: bool = True) -> None:
        """Start Redis, migrate and seed, then web and (unless told not to) one worker. On a
        failure, whatever had started is stopped before the error is raised."""
        try:
            self.redis.start()
            seed = ["seed_demo", f"--staff-password={self.staff_password}"]
            for command in (["migrate", "--no-input", "-v0"], seed):
                done = self.manage(*command)
                if done.returncode != 0:
                    raise RuntimeError(f"manage.py {command[0]} failed: {done.stderr}")
            self.start_web()
            if worker:
                self.start_worker()
        except BaseException:
            self.stop()
            raise

    def start_web(self) -> Process:
        self.web = Process("web", web_command("127.0.0.1", self.port), env=self.env, output=self._log("web"))
        wait_for_port(self.port, process=self.web)
        return self.web

    def restart_web(self) -> Process:
        if self.web is not None:
            self.web.stop()
        return self.start_web()

    def start_worker(self, **extra_env: str) -> Process:
        worker = Process(
            "inference",
            worker_command(),
            env={**self.env, **extra_env},
            output=self._log("worker"),
            stop_timeout_s=WORKER_STOP_TIMEOUT_S,
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

    def stop_worker(self, worker: Process) -> int:
        """SIGTERM: the worker finishes what it runs, then exits; returns its exit code."""
        self.workers.remove(worker)
        return worker.stop()

    def kill_worker(self, worker: Process) -> None:
        """A crash: SIGKILL, nothing handed on."""
        self.workers.remove(worker)
        worker.kill()

    def start_celery(
        self, *, beat: bool = True, queues: str = "celery,batch-jobs", timeout_s: float = 60.0
    ) -> Process:
        """A Celery worker (threads pool), with beat for the periodic tasks unless told not to;
        it consumes the periodic tasks' queue and the batch jobs' unless given `queues`."""
        log_path = self._log("celery")
        command = celery_command(queues=queues, concurrency=4, pool="threads")
        if beat:
            command += ["--beat", "--schedule", str(self.workdir / "celerybeat-schedule")]
        celery = Process("celery", command, env=self.env, output=log_path)
        self.celery_workers.append(celery)
        deadline = time.monotonic() + timeout_s
        while b" ready." not in log_path.read_bytes():
            if not celery.running() or time.monotonic() > deadline:
                raise RuntimeError(f"the Celery worker did not start; see {log_path}")
            time.sleep(0.1)
        return celery

    def kill_celery(self, celery: Process) -> None:
        """A crash: the worker and its beat die at once, without handing anything on."""
        celery.kill()
        self.celery_workers.remove(celery)

    def manage(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run a management command against this stack's Redis and database."""
        return subprocess.run(manage_command(*args), env=self.env, cwd=ROOT, capture_output=True, text=True)

    def create_api_key(self, username: str, *, tier: str = "") -> str:
        """Issue an API key with `manage.py apikey create`; returns the key."""
        done = self.manage("apikey", "create", "--user", username, *(["--tier", tier] if tier else []))
        if done.returncode != 0:
            raise RuntimeError(f"manage.py apikey create failed: {done.stderr}")
        return done.stdout.strip()

    def stop(self) -> None:
        """Celery, then workers (they drain), then web, then Redis: nothing is left running."""
        web = [self.web] if self.web is not None else []
        try:
            stop_in_order([*self.celery_workers, *self.workers, *web])
        finally:
            self.celery_workers, self.workers, self.web = [], [], None
            self.redis.stop()
