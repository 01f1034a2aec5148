"""Engine processes end with their worker, however it ends.

vLLM runs its engine core, and the core its own workers, in child processes that outlive a
worker killed with SIGKILL (as the kernel's OOM killer does): they keep holding the model and
the KV cache, and on a GPU that memory stops the worker that replaces it from starting. So
before the engine starts, the worker marks its environment with its identity, which every
engine process inherits, and starts a guard: a small process that checks twice a second that
the worker lives, noting its descendants, and once the worker is gone without having stood the
guard down, kills them and every other process with the worker's mark. (A parent-death signal
would not do: the engine is built in a thread, and that signal fires when the thread that
started a process ends, not the process.)

A worker that starts ends the marked processes of a dead worker whose guard died too, and
says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

logger = logging.getLogger(__name__)

# "<pid>:<create time>" of the worker that started the engine, inherited by every process it spawns.
OWNER_VARIABLE = "INFERENCE_ENGINE_OWNER"
POLL_S = 0.5


def _identity(process: psutil.Process) -> str:
    return f"{process.pid}:{process.create_time()}"


class EngineGuard:
    """Start before the engine, stand down after its clean shutdown."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        me = psutil.Process()
        os.environ[OWNER_VARIABLE] = _identity(me)
        # vLLM retitles its processes with setproctitle, which by default writes over the
        # environment block (and the mark with it) unless this is set.
        os.environ["SPT_NOENV"] = "1"
        # Isolated (-I): this folder, where vllm.py lives, stays off the guard's import path.
        self._process = subprocess.Popen(
            [sys.executable, "-I", str(Path(__file__).resolve()), os.environ[OWNER_VARIABLE]]
        )

    def stand_down(self) -> None:
        """The engine shut down cleanly: the guard leaves without killing anything."""
        if self._process is not None:
            self._process.terminate()
            self._process.wait()
            self._process = None


def orphaned_engines_end() -> list[psutil.Process]:
    """End engine processes whose worker is gone; returns them (already ended)."""
    orphans = [process for process, owner in _engine_processes() if not _alive(owner)]
    if not orphans:
        return []
    held = sum(_rss(process) for process in orphans)
    logger.error(
        "engine processes of a dead worker were still running (pids %s, %.0f MiB), holding its "
        "model and KV cache (on a GPU, device memory this worker needs): ending them. Their "
        "guard did not; see that worker's log.",
        ", ".join(str(process.pid) for process in orphans),
        held / 2**20,
    )
    _kill(orphans)
    psutil.wait_procs(orphans, timeout=10)
    return orphans


def _engine_processes() -> Iterator[tuple[psutil.Process, str]]:
    """Every other process that carries an owner mark, with its owner's identity."""
    me = os.getpid()
    for process in psutil.process_iter():
        if process.pid == me:
            continue
        try:
            owner = process.environ().get(OWNER_VARIABLE)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        if owner:
            yield process, owner


def _alive(identity: str) -> bool:
    try:
        process = psutil.Process(int(identity.partition(":")[0]))
        return _running(process) and _identity(process) == identity
    except (psutil.NoSuchProcess, ValueError):
        return False


def _running(process: psutil.Process) -> bool:
    """Alive, and not a zombie: a killed worker stays one until its parent reaps it."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _rss(process: psutil.Process) -> int:
    try:
        return process.memory_info().rss
    except psutil.Error:
        return 0


def _kill(processes: list[psutil.Process]) -> None:
    for process in processes:
        try:
            process.kill()  # psutil refuses a pid that now belongs to another process
        except psutil.NoSuchProcess:
            continue


def _guard(owner: str) -> None:
    # Ctrl-C in a terminal reaches the whole process group: the worker drains and stands this
    # guard down itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The worker's descendants as last seen, besides the mark: once the worker is gone, they
    # are no longer its children.
    descendants: dict[int, psutil.Process] = {}
    while _alive(owner):
        with contextlib.suppress(psutil.NoSuchProcess):
            for process in psutil.Process(int(owner.partition(":")[0])).children(recursive=True):
                descendants.setdefault(process.pid, process)
        time.sleep(POLL_S)
    descendants.pop(os.getpid(), None)
    for process, marked_by in _engine_processes():
        if marked_by == owner:
            descendants.setdefault(process.pid, process)
    left = [process for process in descendants.values() if _running(process)]
    _kill(left)
    if left:
        print(
            f"engine guard: the worker ({owner}) ended without shutting its engine down; "
            f"killed {', '.join(str(process.pid) for process in left)}",
            file=sys.stderr,
            flush=True,
        )


if __name__ == "__main__":
    _guard(sys.argv[1])
