"""The SSE relay: turn a request's result stream into the browser's event stream.

Replays from the client's Last-Event-ID, then follows live; while the request waits in the
queue it sends `status` events with the position and ETA, and a heartbeat comment whenever
the stream has been quiet for the heartbeat interval.
"""

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator

import redis
from django.conf import settings

from chat.sse import sse_comment, sse_event, sse_event_json, sse_retry
from scheduler.generation import TERMINAL_EVENTS, Done, Queued, Start, Tier, Token, event_data
from scheduler.queues import claimed_through, queue_state_async
from scheduler.redis import async_redis
from scheduler.results import ResultEvent, result_follower

SNAPSHOT_S = 1.0
# How soon a browser whose stream broke reconnects (SSE `retry:`).
RECONNECT_MS = 2000

# (loop, model, tier) -> (read at, claimed through, drain rate): every queued stream of this
# process shares one read of its queue a second, instead of two reads per stream.
_snapshots: dict[tuple[asyncio.AbstractEventLoop, str, str], tuple[float, int, float]] = {}


async def _queue_snapshot(model: str, tier: str) -> tuple[int, float]:
    key = (asyncio.get_running_loop(), model, tier)
    cached = _snapshots.get(key)
    if cached is not None and time.monotonic() - cached[0] < SNAPSHOT_S:
        return cached[1], cached[2]
    client = async_redis()
    claimed = await claimed_through(client, model=model, tier=tier)
    state = await queue_state_async(client, model=model, tier=tier)
    _snapshots[key] = (time.monotonic(), claimed, state.drain_rate_per_s)
    return claimed, state.drain_rate_per_s


async def _queued_status(model: str, tier: str, seq: int) -> dict:
    try:
        claimed, drain_rate_per_s = await _queue_snapshot(model, tier)
    except (redis.ConnectionError, redis.TimeoutError):
        return {"state": "queued", "position": None, "eta_s": None}  # Redis is restarting
    position = seq - claimed
    if position <= 0:
        return {"state": "starting"}
    return {"state": "queued", "position": position, "eta_s": round(position / drain_rate_per_s, 1)}


def _sse_for(event: ResultEvent) -> bytes:
    """Result events are the browser's events, but for `start`, which it sees as a status."""
    if event.type == Token.type:
        # The per-token path: the stream holds the token as the browser reads it (undecoded).
        return sse_event_json(event.type, event.data, event.id)
    if isinstance(event.body, Start):
        return sse_event("status", {"state": "running"}, event.id)
    if isinstance(event.body, Done) and event.body.timings is not None:
        # The kind of engine (is it simulated?), not which model wrote it: during a canary on
        # another model that would tell customers which variant answered (as its name would).
        engine = event.body.timings.engine.partition(":")[0]
        body = dataclasses.replace(event.body, timings=dataclasses.replace(event.body.timings, engine=engine))
        return sse_event(event.type, event_data(body), event.id)
    return sse_event(event.type, event_data(event.body), event.id)


async def relay_events(*, model: str, request_id: str, after_id: str) -> AsyncIterator[bytes]:
    heartbeat_s = settings.SSE_HEARTBEAT_S
    status_s = settings.SSE_STATUS_INTERVAL_S
    async with result_follower().subscribe(
        model=model, request_id=request_id, after_id=after_id
    ) as subscription:
        yield sse_retry(RECONNECT_MS)
        queued: tuple[Tier, int] | None = None  # (tier, seq) while waiting in the queue
        last_write = last_status = time.monotonic()
        while True:
            now = time.monotonic()
            wait = heartbeat_s - (now - last_write)
            if queued is not None:
                wait = min(wait, status_s - (now - last_status))
            try:
                events = await subscription.next_batch(max(wait, 0))
            except TimeoutError:
                now = time.monotonic()
                if queued is not None and now - last_status >= status_s:
                    status = await _queued_status(model, *queued)
                    yield sse_event("status", status, subscription.cursor)
                    last_status = last_write = now
                elif now - last_write >= heartbeat_s:
                    yield sse_comment("heartbeat")
                    last_write = now
                continue
            frames: list[bytes] = []
            for event in events:
                if event.type == Queued.type:
                    queued = (event.body.tier, event.body.seq)
                    frames.append(sse_event("status", await _queued_status(model, *queued), event.id))
                    last_status = time.monotonic()
                    continue
                if event.type == Start.type:
                    queued = None
                frames.append(_sse_for(event))
                if event.type in TERMINAL_EVENTS:
                    yield b"".join(frames)
                    return
            if frames:
                # Everything that arrived together goes out in one write.
                yield b"".join(frames)
                last_write = time.monotonic()
