"""Real processes for tests: a private redis-server and PostgreSQL, and the product's own commands."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout_s: float = 30.0, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on port {port} after {timeout_s}s")


class RedisServer:
    """A redis-server on a free port with AOF, so a restart keeps what it accepted."""

    def __init__(self, data_dir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        self.data_dir = data_dir
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.data_dir),
                "--appendonly",
                "yes",
                # As in production: fsync once a second; a clean shutdown flushes everything.
                "--appendfsync",
                "everysec",
                "--save",
                "",
                "--daemonize",
                "no",
                "--logfile",
                str(self.data_dir / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
        )
        wait_for_port(self.port, process=self.process)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=10)
        self.process = None

    def restart(self, down_for_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_for_s)
        self.start()


def postgres_bindir() -> Path | None:
    """Where initdb and postgres are: on PATH, or where Debian's packages keep them (off PATH)."""
    initdb = shutil.which("initdb")
    if initdb is not None:
        return Path(initdb).resolve().parent
    installed = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda path: int(path.parent.parent.name)
    )
    return installed[-1].parent if installed else None


class PostgresServer:
    """A PostgreSQL cluster of its own (initdb in a temporary folder) on a free port.

    Like the private redis-server: the machine's own database service is never touched, several
    runs can share a machine, and a machine with the binaries but no running service works.
    """

    SUPERUSER = "postgres"

    def __init__(self, workdir: Path) -> None:
        bindir = postgres_bindir()
        if bindir is None:
            raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
        self.bindir = bindir
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.port = free_port()
        # initdb and postgres refuse to run as root; Debian's package creates this account.
        self.os_user = "postgres" if os.geteuid() == 0 else None
        self.process: subprocess.Popen | None = None

    def url(self, database: str) -> str:
        return f"postgres://{self.SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def start(self, timeout_s: float = 60.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.os_user is not None:
            shutil.chown(self.workdir, user=self.os_user)
        if not (self.data_dir / "PG_VERSION").exists():
            subprocess.run(
                [
                    str(self.bindir / "initdb"),
                    "--pgdata", str(self.data_dir),
                    "--username", self.SUPERUSER,
                    "--auth", "trust",
                    "--encoding", "UTF8",
                    "--no-locale",
                    "--no-sync",
                ],
                user=self.os_user,
                cwd=self.workdir,
                check=True,
                stdout=subprocess.DEVNULL,
            )  # fmt: skip
        with open(self.workdir / "postgres.log", "ab") as log:
            self.process = subprocess.Popen(
                [
                    str(self.bindir / "postgres"),
                    "-D", str(self.data_dir),
                    "-p", str(self.port),
                    "-c", "listen_addresses=127.0.0.1",
                    "-c", f"unix_socket_directories={self.workdir}",
                    # A throwaway cluster: no test needs it to survive a power cut.
                    "-c", "fsync=off",
                    "-c", "synchronous_commit=off",
                    "-c", "full_page_writes=off",
                ],
                user=self.os_user,
                cwd=self.workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        self._wait_accepting(timeout_s)

    def _wait_accepting(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.process.returncode}; see {self.workdir}")
            try:
                psycopg.connect(self.url("postgres"), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def create_database(self, prefix: str) -> str:
        """A new, empty database; returns its name."""
        name = f"{prefix}_{secrets.token_hex(4)}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        with psycopg.connect(self.url("postgres"), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        # SIGINT is PostgreSQL's fast shutdown: it ends open sessions instead of waiting for them.
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            self.process.wait(timeout=30)
        self.process = None
        shutil.rmtree(self.workdir, ignore_errors=True)


def manage(*args: str, env: dict[str, str], **popen_kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), *args], env=env, cwd=ROOT, **popen_kwargs
    )


def daphne(port: int, env: dict[str, str], log_path: Path) -> subprocess.Popen:
    log = open(log_path, "ab")  # noqa: SIM115  (closed with the process)
    process = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    wait_for_port(port, process=process)
    return process


def stop(process: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 30) -> int:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def child_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(overrides)
    return env
