"""`make run`: start the whole product on this machine and stop every part on Ctrl-C.

Starts a private redis-server with AOF under var/ (unless REDIS_URL is set), migrates, seeds
the demo accounts when DEMO_ACCOUNTS is set, then runs web (daphne), the inference worker and
Celery (worker + beat), prefixing each one's output with its name.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the launcher package lives beside scripts/

from launcher.process import Prefixed, Process, port_open, stop_in_order  # noqa: E402
from launcher.redis import RedisServer  # noqa: E402
from launcher.stack import WORKER_STOP_TIMEOUT_S, celery_command, web_command, worker_command  # noqa: E402

VAR = ROOT / "var"
PYTHON = sys.executable
HOST = os.environ.get("HOST", "127.0.0.1")
PORT = int(os.environ.get("PORT", "8000"))
REDIS_PORT = int(os.environ.get("PRIVATE_REDIS_PORT", "6390"))
COLORS = {"redis": 31, "web": 32, "inference": 35, "celery": 36, "celery-jobs": 34}
# The worker's drain and engine shutdown fit in this (checked when it starts).


def say(text: str) -> None:
    print(f"\033[1m==> {text}\033[0m", flush=True)


def start(name: str, command: list[str], env: dict[str, str], **options: float) -> Process:
    return Process(name, command, env=env, output=Prefixed(name, COLORS[name]), **options)


def private_redis(env: dict[str, str]) -> Process | None:
    if os.environ.get("REDIS_URL"):
        say(f"Using Redis at {os.environ['REDIS_URL']}")
        return None
    if shutil.which("redis-server") is None and os.geteuid() == 0 and shutil.which("apt-get"):
        say("redis-server is missing; installing it with apt-get")
        subprocess.run(["apt-get", "update", "-qq"], check=False)
        subprocess.run(["apt-get", "install", "-y", "-qq", "redis-server"], check=False)
    if shutil.which("redis-server") is None:
        sys.exit(
            "redis-server is not installed. Install it (Debian/Ubuntu: sudo apt-get install "
            "redis-server; macOS: brew install redis) or set REDIS_URL to a Redis you run."
        )
    if port_open(REDIS_PORT):
        sys.exit(f"Port {REDIS_PORT} is taken; set PRIVATE_REDIS_PORT to a free port, or REDIS_URL.")
    redis = RedisServer(VAR / "redis", port=REDIS_PORT, output=Prefixed("redis", COLORS["redis"]))
    redis.start()
    env["REDIS_URL"] = redis.url
    say(f"Private Redis with AOF at {env['REDIS_URL']} (data in var/redis)")
    return redis.process


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupt)
    VAR.mkdir(exist_ok=True)
    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    env.setdefault("PYTHONUNBUFFERED", "1")
    # The one worker serves its metrics here (the web's are at /metrics on PORT).
    env.setdefault("WORKER_METRICS_PORT", "9464")
    children: list[Process] = []
    try:
        redis_process = private_redis(env)
        if redis_process is not None:
            children.append(redis_process)
        subprocess.run([PYTHON, "manage.py", "migrate", "--no-input", "-v0"], cwd=ROOT, env=env, check=True)
        # Demo accounts only on request: a staff account, even a demo one, opens the console.
        if os.environ.get("DEMO_ACCOUNTS", "").lower() in {"1", "true", "yes"}:
            subprocess.run([PYTHON, "manage.py", "seed_demo"], cwd=ROOT, env=env, check=True)
        # Stopped in reverse: web first (no new work), then the worker drains, then Celery.
        children.append(start("celery", [*celery_command(queues="celery", concurrency=2), "--beat"], env))
        # Batch job slices on their own worker: the periodic tasks never wait behind them.
        children.append(
            start(
                "celery-jobs",
                [*celery_command(queues="batch-jobs", concurrency=2), "--hostname", "jobs@%h"],
                env,
            )
        )
        children.append(start("inference", worker_command(), env, stop_timeout_s=WORKER_STOP_TIMEOUT_S))
        children.append(start("web", web_command(HOST, PORT), env))
        engine = env.get("INFERENCE_ENGINE", "vllm")
        say(f"Open http://{HOST}:{PORT}/  (engine: {engine}; the console is at /console/; Ctrl-C stops all)")
        while all(process.running() for process in children):
            time.sleep(0.5)
        failed = [process.name for process in children if not process.running()]
        say(f"{', '.join(failed)} stopped; stopping the rest")
    except KeyboardInterrupt:
        say("Stopping")
    finally:
        # Each part gets a bounded time to stop, then its whole process group is killed.
        stop_in_order(reversed(children))
        say("All stopped")


if __name__ == "__main__":
    main()
