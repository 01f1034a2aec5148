"""A PostgreSQL cluster of its own: initdb in a scratch folder, then the server on a port.

The machine's own database service is never touched. initdb and postgres refuse to run as
root, so as root they run as the `postgres` account Debian's package creates.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psycopg

from launcher.process import LOCAL, Output, Place, Process, free_port


def postgres_bindir() -> Path:
    """Where initdb and postgres are: on PATH, or where Debian keeps them (off PATH)."""
    initdb = shutil.which("initdb")
    if initdb is not None:
        return Path(initdb).resolve().parent
    installed = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name)
    )
    if not installed:
        raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
    return installed[-1].parent


class PostgresServer:
    SUPERUSER = "postgres"

    def __init__(
        self, workdir: Path, *, port: int | None = None, place: Place = LOCAL, output: Output = None
    ) -> None:
        self.bindir = postgres_bindir()
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.port = free_port() if port is None else port
        self.place = place
        self.output = output
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            self._as_user = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]
        self.process: Process | None = None

    def url(self, database: str) -> str:
        return f"postgres://{self.SUPERUSER}@{self.place.address}:{self.port}/{database}"

    def start(self, timeout_s: float = 60.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._as_user:
            shutil.chown(self.workdir, user="postgres")
        if not (self.data_dir / "PG_VERSION").exists():
            subprocess.run(
                [
                    *self._as_user,
                    str(self.bindir / "initdb"),
                    "--pgdata", str(self.data_dir),
                    "--username", self.SUPERUSER,
                    "--auth", "trust",
                    "--encoding", "UTF8",
                    "--no-locale",
                    "--no-sync",
                ],
                cwd=self.workdir,
                check=True,
                stdout=subprocess.DEVNULL,
            )  # fmt: skip
            # initdb trusts only loopback; on a host of its own, clients come from its subnet.
            with open(self.data_dir / "pg_hba.conf", "a") as hba:
                hba.write("host all all samenet trust\n")
        command = [
            *self._as_user,
            str(self.bindir / "postgres"),
            "-D", str(self.data_dir),
            "-p", str(self.port),
            "-c", f"listen_addresses={self.place.address}",
            "-c", f"unix_socket_directories={self.workdir}",
            "-c", "max_connections=200",
            # A throwaway cluster: nothing here needs to survive a power cut.
            "-c", "fsync=off",
            "-c", "synchronous_commit=off",
            "-c", "full_page_writes=off",
        ]  # fmt: skip
        # SIGINT is PostgreSQL's fast shutdown: it ends open sessions instead of waiting for them.
        self.process = Process(
            "postgres",
            self.place.command(command),
            env=dict(os.environ),
            output=self.output,
            stop_signal=signal.SIGINT,
            cwd=self.workdir,
        )
        self._wait_accepting(timeout_s)

    def _wait_accepting(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process is not None and not self.process.running():
                raise RuntimeError(f"postgres exited with {self.process.stop()}; see {self.workdir}")
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
        if self.process is not None:
            self.process.stop()
        self.process = None
        shutil.rmtree(self.workdir, ignore_errors=True)
