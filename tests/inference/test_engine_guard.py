"""The engine guard: a worker's engine processes end with it, however it ends; a worker that
starts ends the engines a dead worker left behind."""

import logging
import os
import signal
import subprocess
import sys
import textwrap

import psutil

from inference.engines.guard import OWNER_VARIABLE, orphaned_engines_end

# An engine process retitles itself as vLLM's do, which blanks the start of its environment.
ENGINE = "import setproctitle, time; setproctitle.setproctitle('VLLM::EngineCore'); time.sleep(600)"
# A stand-in for a worker: it starts the guard, then an engine process, as VllmEngine.start does.
WORKER = textwrap.dedent(
    f"""
    import subprocess, sys, time
    from inference.engines.guard import EngineGuard
    guard = EngineGuard()
    guard.start()
    engine = subprocess.Popen([sys.executable, "-c", {ENGINE!r}])
    print(engine.pid, flush=True)
    if sys.argv[1] == "clean":
        guard.stand_down()
        print("stood down", flush=True)
    time.sleep(600)
    """
)


def _worker(mode: str) -> tuple[subprocess.Popen, psutil.Process]:
    worker = subprocess.Popen([sys.executable, "-c", WORKER, mode], stdout=subprocess.PIPE, text=True)
    engine = psutil.Process(int(worker.stdout.readline()))
    return worker, engine


def test_the_engine_ends_when_its_worker_is_killed():
    worker, engine = _worker("kill")
    try:
        worker.send_signal(signal.SIGKILL)  # as the OOM killer does: no handler runs
        _, alive = psutil.wait_procs([engine], timeout=10)
        assert not alive, f"engine process {engine.pid} outlived its worker"
    finally:
        worker.kill()
        worker.wait()
        if engine.is_running():
            engine.kill()


def test_a_guard_stood_down_leaves_and_kills_nothing():
    worker, engine = _worker("clean")
    try:
        assert worker.stdout.readline().strip() == "stood down"
        guards = [p for p in psutil.Process(worker.pid).children() if p.pid != engine.pid]
        assert guards == []  # the guard has exited
        assert engine.is_running()
    finally:
        worker.kill()
        worker.wait()
        engine.kill()


def test_a_starting_worker_ends_the_engine_a_dead_worker_left_and_says_so(caplog):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = f"{dead.pid}:{psutil.Process(dead.pid).create_time()}"
    dead.wait()
    # As EngineGuard.start leaves the environment of the engine it guards.
    engine_env = {**os.environ, OWNER_VARIABLE: identity, "SPT_NOENV": "1"}
    orphan = subprocess.Popen([sys.executable, "-c", ENGINE], env=engine_env)
    try:
        with caplog.at_level(logging.ERROR):
            ended = orphaned_engines_end()
        assert [process.pid for process in ended] == [orphan.pid]
        assert not psutil.pid_exists(orphan.pid) or not ended[0].is_running()
        assert f"engine processes of a dead worker were still running (pids {orphan.pid}," in caplog.text
    finally:
        orphan.kill()
        orphan.wait()
