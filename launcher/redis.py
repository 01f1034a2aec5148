"""A private redis-server with AOF, so that a restart keeps everything it accepted."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from launcher.process import Output, Process, free_port, wait_for_port


class RedisServer:
    """On `port` (a free one by default), its data in `data_dir`."""

    def __init__(self, data_dir: Path, *, port: int | None = None, output: Output = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        self.data_dir = data_dir
        self.port = free_port() if port is None else port
        self.output = output
        self.process: Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            # As in production: fsync once a second; a clean shutdown flushes everything.
            "--appendfsync", "everysec",
            "--save", "",
            "--daemonize", "no",
        ]  # fmt: skip
        self.process = Process("redis", command, env=dict(os.environ), output=self.output)
        try:
            wait_for_port(self.port, process=self.process)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
        self.process = None

    def restart(self, down_for_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_for_s)
        self.start()
