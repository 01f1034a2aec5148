"""Stopping what was started leaves nothing behind: not the children a process started, not
a process that ignores SIGTERM, not the rest when the stop itself is interrupted."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil

from launcher.process import Process, stop_in_order

# A parent that starts a child of its own (as Celery starts beat, or vLLM its engine core),
# both ignoring SIGTERM unless told otherwise, and writes the child's pid to a file.
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"
FAMILY = f"""
import os, signal, subprocess, sys, time
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", {STUBBORN!r}])
open(sys.argv[2], "w").write(str(child.pid))
time.sleep(3600)
"""


def _family(tmp_path: Path, sigterm: str) -> tuple[Process, int]:
    pid_file = tmp_path / f"child-{sigterm}.pid"
    process = Process("family", [sys.executable, "-c", FAMILY, sigterm, str(pid_file)], env=dict(os.environ))
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the family did not start"
        time.sleep(0.05)
    return process, int(pid_file.read_text())


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    """True once the process no longer runs (a SIGKILL lands a moment after it is sent)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_stopped_process_takes_the_children_it_started_along(tmp_path):
    process, child = _family(tmp_path, "obey")
    assert process.stop(timeout_s=10) == -signal.SIGTERM
    assert _gone(child)


def test_a_process_that_ignores_sigterm_is_killed_with_its_children_after_the_timeout(tmp_path):
    process, child = _family(tmp_path, "ignore")
    assert process.stop(timeout_s=0.5) == -signal.SIGKILL
    assert _gone(process.pid)
    assert _gone(child)


def test_an_interrupted_stop_kills_the_rest_instead_of_leaving_them(tmp_path, monkeypatch):
    first, first_child = _family(tmp_path, "ignore")
    second, second_child = _family(tmp_path, "obey")

    def interrupted(timeout_s: float | None = None) -> int:
        raise KeyboardInterrupt  # a second Ctrl-C while the first process is being stopped

    monkeypatch.setattr(first, "stop", interrupted)
    stop_in_order([first, second])
    assert all(_gone(pid) for pid in (first.pid, first_child, second.pid, second_child))
