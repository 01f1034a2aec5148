"""One child process in its own session, and the ways to end it so that nothing outlives it.

A child leads a process group of its own: a Ctrl-C in the terminal reaches the launcher only,
which stops the children in order, and ending a child ends everything it started (Celery's
pool and beat, vLLM's engine core). Stopping is SIGTERM to the leader, a bounded wait, then
SIGKILL to the whole group; the leader is reaped only after its group was killed, so the group
id cannot have been reused by then.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
POLL_S = 0.05


@dataclass(frozen=True)
class Prefixed:
    """Copy the child's output to ours, each line prefixed with a coloured label."""

    label: str
    colour: int

    def pump(self, stream: IO[str]) -> None:
        prefix = f"\033[{self.colour}m{self.label:>9} |\033[0m "
        for line in stream:
            sys.stdout.write(prefix + line)
            sys.stdout.flush()


# Where a child's output goes: nowhere, appended to a log file, or prefixed onto ours.
Output = Path | Prefixed | None


@dataclass(frozen=True)
class Place:
    """Where a child runs: the address it serves on, and the command prefix that puts it there
    (none on this machine; `ip netns exec <namespace>` on a host of launcher.netns)."""

    address: str = "127.0.0.1"
    prefix: tuple[str, ...] = ()

    def command(self, command: Sequence[str]) -> list[str]:
        return [*self.prefix, *command]


LOCAL = Place()


class Process:
    """A started child. `stop()` and `kill()` end its whole process group."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        *,
        env: dict[str, str],
        output: Output = None,
        stop_timeout_s: float = 10.0,
        stop_signal: int = signal.SIGTERM,
        cwd: Path = ROOT,
    ) -> None:
        self.name = name
        self.stop_timeout_s = stop_timeout_s
        self.stop_signal = stop_signal
        self._log: IO[bytes] | None = None
        stdout: int | IO[bytes] = subprocess.DEVNULL
        if isinstance(output, Path):
            self._log = stdout = open(output, "ab")  # noqa: SIM115  (closed when the process ends)
        elif isinstance(output, Prefixed):
            stdout = subprocess.PIPE
        self.popen = subprocess.Popen(
            list(command),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            text=isinstance(output, Prefixed),
            start_new_session=True,
        )
        if isinstance(output, Prefixed):
            threading.Thread(target=output.pump, args=(self.popen.stdout,), daemon=True).start()

    def __repr__(self) -> str:
        return f"<Process {self.name} pid={self.pid}>"

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def running(self) -> bool:
        return not self._exited()

    def wait(self, timeout_s: float) -> int:
        """Wait for the process to end by itself (raises TimeoutError); whatever it started
        and left behind is killed with it."""
        if not self._exited_within(timeout_s):
            raise TimeoutError(f"{self.name} (pid {self.pid}) still running after {timeout_s}s")
        return self._reap()

    def send_signal(self, signum: int) -> None:
        """A signal to the leader alone (SIGTERM to see it stop by itself, SIGSTOP to freeze it)."""
        if not self._exited():
            self.popen.send_signal(signum)

    def stop(self, timeout_s: float | None = None) -> int:
        """SIGTERM (or its own stop signal), then SIGKILL to the whole group if it has not ended
        within the timeout."""
        if not self._exited():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, self.stop_signal)
            self._exited_within(self.stop_timeout_s if timeout_s is None else timeout_s)
        return self._reap()

    def kill(self) -> int:
        """SIGKILL to the whole group at once: a crash, nothing handed on."""
        return self._reap()

    def _exited(self) -> bool:
        """True once the leader has exited, without reaping it (WNOWAIT): until it is reaped
        its pid, and so its group id, cannot be taken by another process."""
        if self.popen.returncode is not None:
            return True
        try:
            return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:  # reaped elsewhere
            return True

    def _exited_within(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self._exited():
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
        return True

    def _reap(self) -> int:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        returncode = self.popen.wait()
        if self._log is not None:
            self._log.close()
        return returncode


def interrupt_on(*signums: int) -> None:
    """Make each signal stop this program as Ctrl-C does (KeyboardInterrupt), so that what it
    started is stopped on the way out rather than left running without its owner."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for signum in signums:
        signal.signal(signum, interrupt)


def stop_in_order(processes: Iterable[Process]) -> None:
    """Stop each process in turn, each within its bounded wait. An interrupt meanwhile (a
    second Ctrl-C, a SIGTERM from a supervisor) kills the rest at once rather than leaving
    them behind."""
    remaining = list(processes)
    try:
        while remaining:
            remaining[0].stop()
            remaining.pop(0)
    except KeyboardInterrupt:
        for process in remaining:
            while True:
                try:
                    process.kill()
                    break
                except KeyboardInterrupt:
                    continue  # killing is idempotent: finish it whatever arrives meanwhile


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


def wait_for_port(
    port: int, *, process: Process | None = None, timeout_s: float = 30.0, host: str = "127.0.0.1"
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and not process.running():
            raise RuntimeError(f"{process.name} exited with {process.stop()} before listening on {port}")
        if port_open(port, host):
            return
        time.sleep(POLL_S)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout_s}s")
