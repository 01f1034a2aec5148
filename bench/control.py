"""Control messages to the workers (cancel, drain) over Redis pub/sub, as `scheduler/control.py`
sends them, against the channel layer as settings configure it (channels_redis): each worker
joins one group with a channel of its own, and a cancel is a `group_send` to it.

Measured: the time from a cancel call in a web process to the worker's handler (idle listener
processes, one per worker), and what a Redis restart does to each: the sends that fail while it
is down, the messages sent after it is back that never arrive, and how long until the listeners
hear again. Both sides keep the cancel key (`keys.cancel`): only the message's path differs.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from multiprocessing.queues import Queue
from pathlib import Path

import psutil
import redis

REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError)
TRANSPORTS = ("pubsub", "layer")
GROUP = "inference.control"  # what a worker would join with its own channel
RECONNECT_PAUSE_S = 0.5  # the pause control.control_messages takes before resubscribing


# --- the worker's side: one process per worker, reporting each handled cancel -----------------


async def _listen_pubsub(handled: Callable[[str], None]) -> None:
    from scheduler import control
    from scheduler.redis import async_redis

    async for message in control.control_messages(async_redis()):
        handled(message["request_id"])


async def _listen_layer(handled: Callable[[str], None]) -> None:
    """A worker's control loop on the channel layer, recovering as control.control_messages does
    for pub/sub: on a lost connection, pause, join the group again (a Redis without its data has
    forgotten the group) and go on receiving on the same channel, where what was sent meanwhile
    waits."""
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    channel = await layer.new_channel("worker")
    while True:
        try:
            await layer.group_add(GROUP, channel)
            while True:
                message = await layer.receive(channel)
                handled(message["request_id"])
        except (*REDIS_ERRORS, OSError):
            await asyncio.sleep(RECONNECT_PAUSE_S)


def _listener(transport: str, arrivals: Queue) -> None:
    import django

    django.setup()
    # Each restart logs a line a second per listener: the figures say what happened.
    logging.getLogger("scheduler.control").setLevel(logging.ERROR)
    listen = _listen_pubsub if transport == "pubsub" else _listen_layer
    pid = os.getpid()
    asyncio.run(listen(lambda request_id: arrivals.put((pid, request_id, time.monotonic()))))


# --- the web's side: a sync service called from a request thread, as daphne runs it ----------


def _cancel_sender(transport: str) -> Callable[[str], None]:
    from scheduler import control

    if transport == "pubsub":
        return lambda request_id: control.request_cancel(request_id=request_id)

    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from scheduler import keys
    from scheduler.redis import sync_redis

    layer = get_channel_layer()

    def cancel(request_id: str) -> None:
        sync_redis().set(keys.cancel(request_id), 1, ex=control.CANCEL_TTL_S)
        async_to_sync(layer.group_send)(GROUP, {"type": "control.cancel", "request_id": request_id})

    return cancel


class _Run:
    """Listener processes of one transport, and what they handled."""

    def __init__(self, transport: str, listeners: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.arrivals: Queue = context.Queue()
        self.processes = [
            context.Process(target=_listener, args=(transport, self.arrivals), daemon=True)
            for _ in range(listeners)
        ]
        for process in self.processes:
            process.start()
        self.send = _cancel_sender(transport)
        self.sent: dict[str, float] = {}  # request id → when the call started
        self.failed: dict[str, float] = {}
        self.handled: dict[str, dict[int, float]] = {}  # request id → listener pid → when

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.join()

    def listeners_cpu_s(self) -> float:
        return sum(sum(psutil.Process(p.pid).cpu_times()[:2]) for p in self.processes)

    def collect(self) -> None:
        while not self.arrivals.empty():
            pid, request_id, at = self.arrivals.get()
            self.handled.setdefault(request_id, {})[pid] = at

    async def cancel(self) -> tuple[str, float]:
        from asgiref.sync import sync_to_async

        request_id = str(uuid.uuid4())
        started = time.monotonic()
        try:
            await sync_to_async(self.send)(request_id)
            self.sent[request_id] = started
        except REDIS_ERRORS:
            self.failed[request_id] = started
        return request_id, time.monotonic() - started

    async def until_every_listener_hears(self, timeout_s: float) -> None:
        """Send probes until one reaches every listener."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            request_id, _ = await self.cancel()
            await asyncio.sleep(0.05)
            self.collect()
            if len(self.handled.get(request_id, {})) == len(self.processes):
                return
        raise RuntimeError(f"listeners did not hear within {timeout_s} s")

    def latencies(self, request_ids: list[str]) -> list[float]:
        return [
            at - self.sent[request_id]
            for request_id in request_ids
            for at in self.handled.get(request_id, {}).values()
        ]


def _redis_commands() -> int:
    from scheduler.redis import sync_redis

    return int(sync_redis().info("stats")["total_commands_processed"])


async def _group_forget() -> None:
    """Each run starts listeners of its own and kills the last run's, as a crash would. A killed
    listener's channel stays in the group until the group's expiry (a day) and keeps taking its
    share of every group_send, up to its capacity: start each run with an empty layer."""
    from channels.layers import get_channel_layer

    await get_channel_layer().flush()


async def _wait_delivered(run: _Run, request_ids: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run.collect()
        if all(len(run.handled.get(r, {})) == len(run.processes) for r in request_ids):
            return
        await asyncio.sleep(0.05)


async def _latency(transport: str, listeners: int, cancels: int, interval_s: float) -> dict:
    from bench.stats import distribution

    await _group_forget()
    run = _Run(transport, listeners)
    try:
        await run.until_every_listener_hears(timeout_s=120)
        listeners_cpu = run.listeners_cpu_s()
        commands = _redis_commands()
        request_ids, call_s = [], []
        for _ in range(cancels):
            tick = time.monotonic()
            request_id, took = await run.cancel()
            request_ids.append(request_id)
            call_s.append(took)
            await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - tick)))
        await _wait_delivered(run, request_ids, timeout_s=10)
        listeners_cpu = run.listeners_cpu_s() - listeners_cpu
        commands = _redis_commands() - commands
        to_handler = [s * 1000 for s in run.latencies(request_ids)]
        return {
            "transport": transport,
            "listeners": listeners,
            "cancels": cancels,
            "to_handler_ms": distribution(to_handler),
            "to_handler_max_ms": max(to_handler),
            "call_ms": distribution([s * 1000 for s in call_s]),
            "missed": cancels * listeners - len(to_handler),
            # Load-independent costs: Redis commands, and the listeners' CPU, per cancel.
            "redis_commands_per_cancel": round(commands / cancels, 1),
            "listener_cpu_ms_per_cancel": round(listeners_cpu * 1000 / cancels, 3),
            "failed_sends": len(run.failed),
        }
    finally:
        run.stop()


async def _restart(transport: str, listeners: int, redis_server, down_s: float, interval_s: float) -> dict:
    """A cancel every `interval_s` while Redis stops (a clean shutdown: its AOF is flushed), stays
    down `down_s` and starts again. A cancel counts in the phase its call started in."""
    await _group_forget()
    run = _Run(transport, listeners)
    try:
        await run.until_every_listener_hears(timeout_s=120)
        sending = True

        async def send_all() -> None:
            while sending:
                tick = time.monotonic()
                await run.cancel()
                await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - tick)))

        sender = asyncio.create_task(send_all())
        await asyncio.sleep(1.0)
        down_at = time.monotonic()
        await asyncio.to_thread(redis_server.stop)
        await asyncio.sleep(down_s)
        await asyncio.to_thread(redis_server.start)
        up_at = time.monotonic()
        await asyncio.sleep(8.0)
        sending = False
        await sender
        after = [r for r, at in run.sent.items() if at >= up_at]
        await _wait_delivered(run, after, timeout_s=5)
        run.collect()

        def lost(request_id: str) -> bool:
            return len(run.handled.get(request_id, {})) < len(run.processes)

        down = [r for r, at in run.sent.items() if down_at <= at < up_at]
        failed_down = [at for at in run.failed.values() if down_at <= at < up_at]
        failed_after = [at - up_at for at in run.failed.values() if at >= up_at]
        lost_after = [run.sent[r] - up_at for r in after if lost(r)]
        arrivals = [at - up_at for handled in run.handled.values() for at in handled.values() if at >= up_at]
        return {
            "transport": transport,
            "listeners": listeners,
            "down_s": down_s,
            "failed_while_down": len(failed_down),
            "sent_while_down": len(down),
            "lost_while_down": sum(1 for r in down if lost(r)),
            "failed_after_up": len(failed_after),
            "last_failed_after_up_s": max(failed_after, default=None),
            "sent_after_up": len(after),
            "lost_after_up": len(lost_after),
            "last_lost_after_up_s": max(lost_after, default=None),
            "first_arrival_after_up_s": min(arrivals, default=None),
            "max_latency_after_up_s": max(
                (at - run.sent[r] for r in after for at in run.handled.get(r, {}).values()), default=None
            ),
        }
    finally:
        run.stop()


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


def control(*, cancels: int, listeners: list[int], rounds: int, interval_s: float = 0.01) -> dict:
    """Runs before Django is set up: the listeners and this process share a private Redis."""
    from launcher.redis import RedisServer

    redis_server = RedisServer(Path(tempfile.mkdtemp(prefix="bench-control-redis-")))
    redis_server.start()
    os.environ["REDIS_URL"] = redis_server.url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    rows: list[dict] = []
    restarts: list[dict] = []
    try:
        for round_number in range(rounds):
            for count in listeners:
                for transport in TRANSPORTS:
                    row = asyncio.run(_latency(transport, count, cancels, interval_s))
                    row["round"] = round_number
                    rows.append(row)
                    latency = row["to_handler_ms"]
                    print(
                        f"round {round_number}  {transport:<6} listeners {count}  cancel→handler p50 "
                        f"{latency['p50']:.2f} ms  p99 {latency['p99']:.2f} ms  "
                        f"max {row['to_handler_max_ms']:.2f} ms  call p50 {row['call_ms']['p50']:.2f} ms  "
                        f"missed {row['missed']}  Redis commands/cancel {row['redis_commands_per_cancel']}  "
                        f"listener CPU/cancel {row['listener_cpu_ms_per_cancel']:.3f} ms",
                        flush=True,
                    )
            for transport in TRANSPORTS:
                row = asyncio.run(_restart(transport, 1, redis_server, down_s=1.0, interval_s=interval_s * 2))
                row["round"] = round_number
                restarts.append(row)
                print(
                    f"round {round_number}  {transport:<6} Redis down {row['down_s']:.0f} s: sends "
                    f"failed {row['failed_while_down']}, went through {row['sent_while_down']} "
                    f"(lost {row['lost_while_down']}); once back: sends failed {row['failed_after_up']} "
                    f"(last {_seconds(row['last_failed_after_up_s'])}), lost {row['lost_after_up']}/"
                    f"{row['sent_after_up']} (last {_seconds(row['last_lost_after_up_s'])}), first "
                    f"arrival {_seconds(row['first_arrival_after_up_s'])}, max latency "
                    f"{_seconds(row['max_latency_after_up_s'])}",
                    flush=True,
                )
    finally:
        redis_server.stop()
    return {"load_average": os.getloadavg(), "latency": rows, "restart": restarts}
