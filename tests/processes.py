"""Real processes for tests: a private redis-server, and the product's own commands."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

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
