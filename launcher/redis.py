"""A private redis-server with AOF, so that a restart keeps everything it accepted; a replica
of another, and the Sentinels that promote a replica when the primary dies. Each may require
a login: a password, or an account (ACL user) with its password."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from launcher.process import LOCAL, Output, Place, Process, free_port, wait_for_port


def redis_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    return binary


@dataclass(frozen=True)
class RedisLogin:
    """Who a client logs in as: an account of its own, or Redis's default user (`requirepass`)."""

    password: str
    username: str | None = None

    @property
    def userinfo(self) -> str:
        """As a URL writes it before the host."""
        return f"{quote(self.username or '', safe='')}:{quote(self.password, safe='')}@"


class RedisServer:
    """On `port` (a free one by default) at `place`, its data in `data_dir`; a replica of
    `replica_of` (host, port) when given. With `login`, clients (replicas and Sentinels too)
    must log in with it; every server of a group gets the same, since any may become primary."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        output: Output = None,
        place: Place = LOCAL,
        replica_of: tuple[str, int] | None = None,
        login: RedisLogin | None = None,
    ) -> None:
        self.binary = redis_binary()
        self.data_dir = data_dir
        self.port = free_port() if port is None else port
        self.output = output
        self.place = place
        self.replica_of = replica_of
        self.login = login
        self.process: Process | None = None

    @property
    def host(self) -> str:
        return self.place.address

    @property
    def url(self) -> str:
        userinfo = self.login.userinfo if self.login else ""
        return f"redis://{userinfo}{self.host}:{self.port}/0"

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
        if self.login is not None:
            command += ["--masterauth", self.login.password]
            if self.login.username is None:
                command += ["--requirepass", self.login.password]
            else:
                user = self.login.username
                command += ["--masteruser", user, "--user", "default", "off"]
                command += ["--user", user, "on", f">{self.login.password}", "~*", "&*", "+@all"]
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
    """One Sentinel watching the primary named `master_name`, logging in to it (and its replicas)
    with `login`; clients, and the other Sentinels, log in to it with `password` when given
    (all Sentinels of a group have the same). Sentinels rewrite their config file as they learn,
    so each has its own in `data_dir`."""

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
        login: RedisLogin | None = None,
        password: str | None = None,
    ) -> None:
        self.binary = redis_binary()
        self.data_dir = data_dir
        self.login = login
        self.password = password
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
        name = self.master_name
        lines = [
            f"port {self.port}",
            f"bind {self.place.address}",
            f"dir {self.data_dir}",
            f"protected-mode {'yes' if self.place.address == '127.0.0.1' else 'no'}",
            f"sentinel monitor {name} {self.primary[0]} {self.primary[1]} {self.quorum}",
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}",
            # After a failed attempt, the next may start this much later (and the whole failover
            # must fit in it).
            f"sentinel failover-timeout {name} {max(3 * self.down_after_ms, 3000)}",
            f"sentinel parallel-syncs {name} 1",
        ]
        if self.login is not None:
            if self.login.username is not None:
                lines.append(f"sentinel auth-user {name} {self.login.username}")
            lines.append(f"sentinel auth-pass {name} {self.login.password}")
        if self.password is not None:
            lines.append(f"requirepass {self.password}")
        config.write_text("".join(f"{line}\n" for line in lines))
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
