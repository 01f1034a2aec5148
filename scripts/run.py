"""`make run`: start the whole product on this machine and stop every part on Ctrl-C.

Starts a private redis-server with AOF under var/ (unless REDIS_URL or REDIS_SENTINELS says
which Redis to use), migrates, imports the demo help center, seeds the demo accounts when
DEMO_ACCOUNTS is set, then runs web (daphne), the inference worker and Celery (worker + beat),
prefixing each one's output with its name.
WEB_PROCESSES=N starts N web processes behind nginx (deploy/nginx.conf) on PORT; WORKERS=N
starts N inference workers.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the launcher package lives beside scripts/

from launcher.nginx import Nginx  # noqa: E402
from launcher.process import (  # noqa: E402
    Place,
    Prefixed,
    Process,
    interrupt_on,
    port_open,
    stop_in_order,
    wait_for_port,
)
from launcher.redis import RedisServer  # noqa: E402
from launcher.stack import WORKER_STOP_TIMEOUT_S, celery_command, web_command, worker_command  # noqa: E402

VAR = ROOT / "var"
DEMO_HELP_CENTER = ROOT / "knowledge" / "demo_help_center"
PYTHON = sys.executable
HOST = os.environ.get("HOST", "127.0.0.1")
PORT = int(os.environ.get("PORT", "8000"))
REDIS_PORT = int(os.environ.get("PRIVATE_REDIS_PORT", "6390"))
WEB_PROCESSES = int(os.environ.get("WEB_PROCESSES", "1"))
WORKERS = int(os.environ.get("WORKERS", "1"))
# The first worker's metrics port; the next workers take the ports after it.
WORKER_METRICS_PORT = int(os.environ.get("WORKER_METRICS_PORT", "9464"))
COLORS = {"redis": 31, "web": 32, "nginx": 33, "inference": 35, "celery": 36, "celery-jobs": 34}


def say(text: str) -> None:
    print(f"\033[1m==> {text}\033[0m", flush=True)


def start(name: str, command: list[str], env: dict[str, str], label: str = "", **options: float) -> Process:
    return Process(name, command, env=env, output=Prefixed(label or name, COLORS[name]), **options)


def install_if_missing(binary: str, package: str) -> None:
    if shutil.which(binary) is None and os.geteuid() == 0 and shutil.which("apt-get"):
        say(f"{binary} is missing; installing it with apt-get")
        subprocess.run(["apt-get", "update", "-qq"], check=False)
        subprocess.run(["apt-get", "install", "-y", "-qq", package], check=False)


def web_processes(env: dict[str, str]) -> list[Process]:
    """One web process on PORT, or several on the ports after it behind nginx on PORT."""
    if WEB_PROCESSES == 1:
        return [start("web", web_command(HOST, PORT), env)]
    install_if_missing("nginx", "nginx")
    if shutil.which("nginx") is None:
        sys.exit(
            "nginx is not installed (Debian/Ubuntu: sudo apt-get install nginx); or run one web process."
        )
    ports = [PORT + n for n in range(1, WEB_PROCESSES + 1)]
    webs = [start("web", web_command("127.0.0.1", port), env, label=f"web-{port}") for port in ports]
    heartbeat = env.get("SSE_HEARTBEAT_S")
    nginx = Nginx(
        VAR / "nginx",
        port=PORT,
        place=Place(address=HOST),
        upstreams=[f"127.0.0.1:{port}" for port in ports],
        sse_heartbeat_s=float(heartbeat) if heartbeat else None,
        output=Prefixed("nginx", COLORS["nginx"]),
    )
    nginx.start()
    assert nginx.process is not None
    return [*webs, nginx.process]


def private_redis(env: dict[str, str]) -> Process | None:
    if os.environ.get("REDIS_SENTINELS"):
        say(f"Using the Redis primary the Sentinels at {os.environ['REDIS_SENTINELS']} name")
        return None
    if os.environ.get("REDIS_URL"):
        where = urlsplit(os.environ["REDIS_URL"])
        say(f"Using Redis at {where.hostname}:{where.port or 6379}")  # not its password
        return None
    install_if_missing("redis-server", "redis-server")
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


def main() -> None:
    interrupt_on(signal.SIGTERM, signal.SIGHUP)
    VAR.mkdir(exist_ok=True)
    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if WEB_PROCESSES > 1:
        # nginx is the web processes' client: they believe the address it forwards.
        env.setdefault("TRUSTED_PROXIES", "127.0.0.1")
    children: list[Process] = []
    try:
        redis_process = private_redis(env)
        if redis_process is not None:
            children.append(redis_process)
        subprocess.run([PYTHON, "manage.py", "migrate", "--no-input", "-v0"], cwd=ROOT, env=env, check=True)
        # The demo shop's help center; a second run only reports what changed in the files.
        help_center = [PYTHON, "manage.py", "import_articles", str(DEMO_HELP_CENTER)]
        if subprocess.run(help_center, cwd=ROOT, env=env).returncode != 0:
            say("The demo help center was not imported (see above): answers go without it.")
        # Demo accounts only on request: a staff account, even a demo one, opens the console.
        if os.environ.get("DEMO_ACCOUNTS", "").lower() in {"1", "true", "yes"}:
            subprocess.run([PYTHON, "manage.py", "seed_demo"], cwd=ROOT, env=env, check=True)
            # The demo staff account answers customers in the inbox too.
            agent = [PYTHON, "manage.py", "agent", "sam", "--display-name", "Sam"]
            subprocess.run(agent, cwd=ROOT, env=env, check=True)
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
        for n in range(WORKERS):
            # Each worker serves its metrics on a port of its own (the web's are at /metrics).
            worker_env = {**env, "WORKER_METRICS_PORT": str(WORKER_METRICS_PORT + n)}
            label = "inference" if WORKERS == 1 else f"inference-{n + 1}"
            children.append(
                start(
                    "inference",
                    worker_command(),
                    worker_env,
                    label=label,
                    stop_timeout_s=WORKER_STOP_TIMEOUT_S,
                )
            )
        web = web_processes(env)
        children.extend(web)
        # Said once the page answers: opened any sooner, it would not load.
        page_host = "127.0.0.1" if HOST in {"0.0.0.0", "::"} else HOST
        wait_for_port(PORT, process=web[-1], timeout_s=120.0, host=page_host)
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
