"""The product on several hosts, each a network namespace on one bridge (launcher.netns):

    lb       nginx with deploy/nginx.conf          web1, web2       daphne
    worker1, worker2   inference (simulated)       celery1, celery2 Celery worker + beat
    redis1   primary, redis2 replica               sentinel1..3     Redis Sentinel (quorum 2)
    db       PostgreSQL

Every process reaches Redis through the Sentinels and PostgreSQL over the bridge; Redis and the
Sentinels want a password each (Redis an account of its own). The test itself is the client, on
this machine's address on the bridge.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from pathlib import Path

import httpx
import psycopg
import redis

from launcher.netns import Network
from launcher.nginx import Nginx
from launcher.postgres import PostgresServer
from launcher.process import Place, Process, stop_in_order, wait_for_port
from launcher.redis import RedisLogin, RedisSentinel, RedisServer
from launcher.stack import (
    PYTHON,
    WORKER_STOP_TIMEOUT_S,
    inherited_env,
    manage_command,
    web_command,
    worker_command,
)

SUBNET = "10.77.0"
MASTER_NAME = "support-chat"
WEB_PORT = 8000
HOSTS = {
    "lb": 10,
    "web1": 11,
    "web2": 12,
    "worker1": 21,
    "worker2": 22,
    "celery1": 31,
    "celery2": 32,
    "redis1": 41,
    "redis2": 42,
    "sentinel1": 51,
    "sentinel2": 52,
    "sentinel3": 53,
    "db": 60,
}


class MultiHost:
    def __init__(self, workdir: Path, **settings_env: str) -> None:
        self.workdir = workdir
        self.network = Network("mh", SUBNET)
        self.settings_env = settings_env
        self.places: dict[str, Place] = {}
        self.redis: dict[str, RedisServer] = {}
        self.sentinels: list[RedisSentinel] = []
        self.postgres: PostgresServer | None = None
        self.nginx: Nginx | None = None
        self.redis_login = RedisLogin(username="support-chat", password=secrets.token_urlsafe(16))
        self.sentinel_password = secrets.token_urlsafe(16)
        self.processes: dict[str, Process] = {}  # web, worker and celery processes by host

    def address(self, host: str) -> str:
        return f"{SUBNET}.{HOSTS[host]}"

    @property
    def base_url(self) -> str:
        return f"http://{self.address('lb')}"

    def web_url(self, host: str) -> str:
        """A web host's own address, past nginx."""
        return f"http://{self.address(host)}:{WEB_PORT}"

    @property
    def database_url(self) -> str:
        assert self.postgres is not None
        return self.postgres.url("support_chat")

    @property
    def env(self) -> dict[str, str]:
        return inherited_env(
            DATABASE_URL=self.database_url,
            REDIS_URL=self.redis["redis1"].url,  # with Sentinels: the login and the database
            REDIS_SENTINELS=",".join(sentinel.address for sentinel in self.sentinels),
            REDIS_SENTINEL_MASTER=MASTER_NAME,
            REDIS_SENTINEL_PASSWORD=self.sentinel_password,
            REDIS_WAIT_REPLICAS="1",
            # Clients come through nginx; probes reach each web host directly.
            DJANGO_ALLOWED_HOSTS=",".join(self.address(host) for host in ("lb", "web1", "web2")),
            TRUSTED_PROXIES=self.address("lb"),
            # The test's clients all come from one host, and follow many answers each.
            STREAMS_MAX_PER_ADDRESS="100000",
            STREAMS_MAX_PER_CLIENT="100000",
            **self.settings_env,
        )

    def redis_client(self, host: str) -> redis.Redis:
        """The test's own client of one Redis or Sentinel host, logged in."""
        if host.startswith("sentinel"):
            login = {"password": self.sentinel_password}
        else:
            login = {"username": self.redis_login.username, "password": self.redis_login.password}
        port = 26379 if host.startswith("sentinel") else 6379
        return redis.Redis(host=self.address(host), port=port, decode_responses=True, **login)

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        self.network.create()
        self.places = {name: self.network.host(name, number) for name, number in HOSTS.items()}
        self.postgres = PostgresServer(
            self.workdir / "db", port=5432, place=self.places["db"], output=self.log("db")
        )
        self.postgres.start()
        with psycopg.connect(self.postgres.url("postgres"), autocommit=True) as admin:
            admin.execute('CREATE DATABASE "support_chat"')
        primary = (self.address("redis1"), 6379)
        self.redis["redis1"] = RedisServer(
            self.workdir / "redis1",
            port=6379,
            place=self.places["redis1"],
            output=self.log("redis1"),
            login=self.redis_login,
        )
        self.redis["redis2"] = RedisServer(
            self.workdir / "redis2",
            port=6379,
            place=self.places["redis2"],
            output=self.log("redis2"),
            replica_of=primary,
            login=self.redis_login,
        )
        for server in self.redis.values():
            server.start()
        for n in (1, 2, 3):
            sentinel = RedisSentinel(
                self.workdir / f"sentinel{n}",
                master_name=MASTER_NAME,
                primary=primary,
                quorum=2,
                place=self.places[f"sentinel{n}"],
                output=self.log(f"sentinel{n}"),
                login=self.redis_login,
                password=self.sentinel_password,
            )
            sentinel.start()
            self.sentinels.append(sentinel)
        done = self.manage("migrate", "--no-input", "-v0")
        if done.returncode != 0:
            raise RuntimeError(f"migrate failed: {done.stderr}")
        for host in ("web1", "web2"):
            self.start_web(host)
        self.nginx = Nginx(
            self.workdir / "lb",
            port=80,
            upstreams=[f"{self.address(host)}:{WEB_PORT}" for host in ("web1", "web2")],
            sse_heartbeat_s=float(self.settings_env["SSE_HEARTBEAT_S"]),
            place=self.places["lb"],
        )
        self.nginx.start()
        for host in ("worker1", "worker2"):
            self.start_worker(host)
        for host in ("celery1", "celery2"):
            self.start_celery(host)
        self.wait_ready()

    def manage(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A management command from this machine, against the hosts' Redis and database."""
        return subprocess.run(manage_command(*args), env=self.env, capture_output=True, text=True)

    def start_web(self, host: str, **settings_env: str) -> None:
        """A web process on the host, with these settings changed from everyone's."""
        web = self._start_process(host, web_command(self.address(host), WEB_PORT), **settings_env)
        wait_for_port(WEB_PORT, process=web, host=self.address(host))

    def start_worker(self, host: str) -> None:
        self._start_process(host, worker_command(), stop_timeout_s=WORKER_STOP_TIMEOUT_S)

    def start_celery(self, host: str) -> None:
        command = [
            PYTHON, "-m", "celery", "-A", "config", "worker",
            "--pool", "threads", "--concurrency", "2", "--loglevel", "INFO",
            "--without-heartbeat", "--without-mingle", "--without-gossip",
            "--beat", "--schedule", str(self.workdir / f"{host}-beat-schedule"),
        ]  # fmt: skip
        self._start_process(host, command)

    def _start_process(
        self, host: str, command: list[str], stop_timeout_s: float = 10.0, **settings_env: str
    ) -> Process:
        process = Process(
            host,
            self.places[host].command(command),
            env={**self.env, **settings_env},
            output=self.log(host),
            stop_timeout_s=stop_timeout_s,
        )
        self.processes[host] = process
        return process

    def stop_process(self, host: str) -> None:
        """The host's process is stopped as a deployment stops it (SIGTERM, then a bounded wait)."""
        self.processes.pop(host).stop()

    def kill(self, host: str) -> None:
        """The host's processes die: they and everything they started end at once, and its
        kernel closes their connections."""
        self.processes.pop(host).kill()

    def unplug(self, host: str) -> None:
        """The host vanishes (power, network): its processes go on, unheard, and none of their
        connections is closed; the others find out only by timeouts."""
        self.network.unplug(host)

    def plug(self, host: str) -> None:
        self.network.plug(host)

    def cut(self, host: str, to_host: str) -> None:
        """What `host` sends to `to_host` is lost from now on, silently."""
        self.network.cut(host, self.address(to_host))

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Until nginx answers /readyz (Redis, database, a live worker) through each web host."""
        deadline = time.monotonic() + timeout_s
        pending = {"web1", "web2"} & set(self.processes)
        while pending:
            for host in sorted(pending):
                try:
                    if httpx.get(f"{self.web_url(host)}/readyz", timeout=2).status_code == 200:
                        pending.discard(host)
                except httpx.HTTPError:
                    pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{pending} not ready after {timeout_s}s; see logs in {self.workdir}")
            time.sleep(0.1)

    def stop(self) -> None:
        """Celery, workers, web, nginx, then Redis, the Sentinels and PostgreSQL; then the hosts."""
        try:
            order = ("celery1", "celery2", "worker1", "worker2", "web1", "web2")
            stop_in_order([self.processes[host] for host in order if host in self.processes])
            self.processes = {}
            for part in (self.nginx, *self.sentinels, *self.redis.values(), self.postgres):
                if part is not None:
                    part.stop()
        finally:
            self.network.destroy()
