"""`make run`: start the whole product on this machine and stop every part on Ctrl-C.

Starts a private redis-server with AOF under var/ (unless REDIS_URL is set), migrates, seeds
the demo accounts, then runs web (daphne), the inference worker and Celery (worker + beat),
prefixing each one's output with its name.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
PYTHON = sys.executable
HOST = os.environ.get("HOST", "127.0.0.1")
PORT = int(os.environ.get("PORT", "8000"))
REDIS_PORT = int(os.environ.get("PRIVATE_REDIS_PORT", "6390"))
COLORS = {"redis": 31, "web": 32, "inference": 35, "celery": 36, "celery-jobs": 34}


def say(text: str) -> None:
    print(f"\033[1m==> {text}\033[0m", flush=True)


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def pump(name: str, stream) -> None:
    prefix = f"\033[{COLORS[name]}m{name:>9} |\033[0m "
    for line in stream:
        sys.stdout.write(prefix + line)
        sys.stdout.flush()


def start(name: str, command: list[str], env: dict[str, str]) -> subprocess.Popen:
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # Ctrl-C reaches us only; we stop the children in order
    )
    threading.Thread(target=pump, args=(name, process.stdout), daemon=True).start()
    return process


def private_redis(env: dict[str, str]) -> subprocess.Popen | None:
    if os.environ.get("REDIS_URL"):
        say(f"Using Redis at {os.environ['REDIS_URL']}")
        return None
    binary = shutil.which("redis-server")
    if binary is None and os.geteuid() == 0 and shutil.which("apt-get"):
        say("redis-server is missing; installing it with apt-get")
        subprocess.run(["apt-get", "update", "-qq"], check=False)
        subprocess.run(["apt-get", "install", "-y", "-qq", "redis-server"], check=False)
        binary = shutil.which("redis-server")
    if binary is None:
        sys.exit(
            "redis-server is not installed. Install it (Debian/Ubuntu: sudo apt-get install "
            "redis-server; macOS: brew install redis) or set REDIS_URL to a Redis you run."
        )
    if port_open(REDIS_PORT):
        sys.exit(f"Port {REDIS_PORT} is taken; set PRIVATE_REDIS_PORT to a free port, or REDIS_URL.")
    data = VAR / "redis"
    data.mkdir(parents=True, exist_ok=True)
    process = start(
        "redis",
        [
            binary,
            "--port",
            str(REDIS_PORT),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(data),
            "--appendonly",
            "yes",
            "--save",
            "",
            "--daemonize",
            "no",
        ],
        env,
    )
    for _ in range(100):
        if port_open(REDIS_PORT):
            break
        time.sleep(0.05)
    env["REDIS_URL"] = f"redis://127.0.0.1:{REDIS_PORT}/0"
    say(f"Private Redis with AOF at {env['REDIS_URL']} (data in var/redis)")
    return process


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
    children: list[tuple[str, subprocess.Popen]] = []
    redis_process = private_redis(env)
    if redis_process is not None:
        children.append(("redis", redis_process))
    try:
        subprocess.run([PYTHON, "manage.py", "migrate", "--no-input", "-v0"], cwd=ROOT, env=env, check=True)
        subprocess.run([PYTHON, "manage.py", "seed_demo"], cwd=ROOT, env=env, check=True)
        # Stopped in reverse: web first (no new work), then the worker drains, then Celery.
        children.append(
            (
                "celery",
                start(
                    "celery",
                    [
                        PYTHON,
                        "-m",
                        "celery",
                        "-A",
                        "config",
                        "worker",
                        "-B",
                        "--queues",
                        "celery",
                        "--loglevel",
                        "INFO",
                        "--concurrency",
                        "2",
                    ],
                    env,
                ),
            )
        )
        # Batch job slices on their own worker: the periodic tasks above never wait behind them.
        children.append(
            (
                "celery-jobs",
                start(
                    "celery-jobs",
                    [
                        PYTHON,
                        "-m",
                        "celery",
                        "-A",
                        "config",
                        "worker",
                        "--queues",
                        "batch-jobs",
                        "--hostname",
                        "jobs@%h",
                        "--loglevel",
                        "INFO",
                        "--concurrency",
                        "2",
                    ],
                    env,
                ),
            )
        )
        children.append(
            ("inference", start("inference", [PYTHON, "manage.py", "runworker", "inference"], env))
        )
        children.append(
            (
                "web",
                start(
                    "web",
                    [PYTHON, "-m", "daphne", "-b", HOST, "-p", str(PORT), "config.asgi:application"],
                    env,
                ),
            )
        )
        engine = env.get("INFERENCE_ENGINE", "vllm")
        say(f"Open http://{HOST}:{PORT}/  (engine: {engine}; the console is at /console/; Ctrl-C stops all)")
        while all(process.poll() is None for _, process in children):
            time.sleep(0.5)
        failed = [name for name, process in children if process.poll() is not None]
        say(f"{', '.join(failed)} stopped; stopping the rest")
    except KeyboardInterrupt:
        say("Stopping")
    finally:
        for name, process in reversed(children):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=40 if name == "inference" else 10)
                except subprocess.TimeoutExpired:
                    process.kill()
        say("All stopped")


if __name__ == "__main__":
    main()
