"""A private redis-server with AOF, so that a restart keeps everything it accepted; a replica
of another, and the Sentinels that promote a replica when the primary dies."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from launcher.process import LOCAL, Output, Place, Process, free_port, wait_for_port


def redis_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    return binary


class RedisServer:
    """On `port` (a free one by default) at `place`, its data in `data_dir`; a replica of
    `replica_of` (host, port) when given."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        output: Output = None,
        place: Place = LOCAL,
        replica_of: tuple[str, int] | None = None,
    ) -> None:
        self.binary = redis_binary()
        self.data_dir = data_dir
        self.port = free_port() if port is None else port
        self.output = output
        self.place = place
        self.replica_of = replica_of
        self.process: Process | None = None

    @property
    def host(self) -> str:
        return self.place.address

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            self.binary,
            "--port", str(self.port),
            "--bind", self.host,
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            # As in production: fsync once a second; a clean shutdown flushes everything.
            "--appendfsync", "everysec",
            "--save", "",
            # A replica (re)connecting is sent the data at once, not after 5 s of waiting for others.
            "--repl-diskless-sync-delay", "0",
            "--daemonize", "no",
        ]  # fmt: skip
        if self.host != "127.0.0.1":
            # Off loopback without a password, Redis refuses clients unless told this network is private.
            command += ["--protected-mode", "no"]
        if self.replica_of is not None:
            command += ["--replicaof", self.replica_of[0], str(self.replica_of[1])]
        self.process = Process("redis", self.place.command(command), env=dict(os.environ), output=self.output)
        try:
            wait_for_port(self.port, process=self.process, host=self.host)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
        self.process = None

    def kill(self) -> None:
        """A crash: SIGKILL, nothing flushed."""
        if self.process is not None:
            self.process.kill()
        self.process = None

    def restart(self, down_for_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_for_s)
        self.start()


class RedisSentinel:
    """One Sentinel watching the primary named `master_name`. Sentinels rewrite their config
    file as they learn, so each has its own in `data_dir`."""

    def __init__(
        self,
        data_dir: Path,
        *,
        master_name: str,
        primary: tuple[str, int],
        quorum: int,
        down_after_ms: int = 1000,
        port: int = 26379,
        place: Place = LOCAL,
        output: Output = None,
    ) -> None:
        self.binary = redis_binary()
        self.data_dir = data_dir
        self.master_name = master_name
        self.primary = primary
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.port = port
        self.place = place
        self.output = output
        self.process: Process | None = None

    @property
    def address(self) -> str:
        return f"{self.place.address}:{self.port}"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "sentinel.conf"
        config.write_text(
            f"port {self.port}\n"
            f"bind {self.place.address}\n"
            f"dir {self.data_dir}\n"
            f"protected-mode {'yes' if self.place.address == '127.0.0.1' else 'no'}\n"
            f"sentinel monitor {self.master_name} {self.primary[0]} {self.primary[1]} {self.quorum}\n"
            f"sentinel down-after-milliseconds {self.master_name} {self.down_after_ms}\n"
            # After a failed attempt, the next may start this much later (and the whole failover
            # must fit in it).
            f"sentinel failover-timeout {self.master_name} {max(3 * self.down_after_ms, 3000)}\n"
            f"sentinel parallel-syncs {self.master_name} 1\n"
        )
        command = [self.binary, str(config), "--sentinel"]
        self.process = Process(
            "sentinel", self.place.command(command), env=dict(os.environ), output=self.output
        )
        try:
            wait_for_port(self.port, process=self.process, host=self.place.address)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
        self.process = None
