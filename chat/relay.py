"""The SSE relay: turn a request's result stream, or a conversation's hand-off events, into the
browser's event stream.

Replays from the client's Last-Event-ID, then follows live; while the request waits in the
queue (or the customer waits for a person) it sends `status` (`waiting`) events with the
position and ETA, and a heartbeat comment whenever the stream has been quiet for the heartbeat
interval.
"""

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator

import redis
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import DatabaseError

from chat import handoff_events
from chat.handoff_selectors import WaitingSnapshot, waiting_snapshot
from chat.sse import sse_comment, sse_event, sse_event_json, sse_retry
from scheduler import keys
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


# --- a conversation's hand-off events ----------------------------------------------------------

# loop -> (read at, snapshot): every waiting customer's stream in this process shares one read
# of the waiting list a second.
_waiting: dict[asyncio.AbstractEventLoop, tuple[float, WaitingSnapshot]] = {}


async def _waiting_status(conversation_id: str) -> dict | None:
    loop = asyncio.get_running_loop()
    cached = _waiting.get(loop)
    if cached is None or time.monotonic() - cached[0] >= SNAPSHOT_S:
        try:
            snapshot = await database_sync_to_async(waiting_snapshot, thread_sensitive=False)()
        except DatabaseError:
            return None  # busy: the next interval tries again
        _waiting[loop] = cached = (time.monotonic(), snapshot)
    return cached[1].status(conversation_id)


# The stream ends with these: the conversation left the person (the page goes on with the
# assistant, or asks for a rating, and opens a stream again if a person is asked for again).
_ENDS_STREAM = frozenset({handoff_events.HandedBack.type, handoff_events.RatingRequest.type, "error"})


def _conversation_frame(event: handoff_events.ConversationEvent) -> bytes | None:
    body = event.body
    if isinstance(body, handoff_events.Typing) and time.time() * 1000 - event.at_ms > (
        handoff_events.TYPING_FRESH_S * 1000
    ):
        return None  # replayed after a reconnect: nobody is typing that any more
    return sse_event(body.type, handoff_events.event_data(body), event.id)


async def relay_conversation(*, conversation_id: str, after_id: str, waiting: bool) -> AsyncIterator[bytes]:
    """A conversation's hand-off events as the customer's page reads them: `waiting` (the
    place among waiting customers, the expected wait, whether anyone is online) while waiting,
    then what agents and the customer's other pages do. Never a private note: those are not in
    the stream."""
    heartbeat_s = settings.SSE_HEARTBEAT_S
    status_s = settings.SSE_STATUS_INTERVAL_S
    async with result_follower().follow(
        key=keys.conversation_events(conversation_id),
        after_id=after_id,
        codec=handoff_events.CONVERSATION_EVENTS,
    ) as subscription:
        yield sse_retry(RECONNECT_MS)
        last_write = time.monotonic()
        last_status = 0.0
        while True:
            now = time.monotonic()
            if waiting and now - last_status >= status_s:
                status = await _waiting_status(conversation_id)
                if status is not None:
                    yield sse_event("waiting", status, subscription.cursor)
                    last_write = now
                last_status = now
            wait = heartbeat_s - (now - last_write)
            if waiting:
                wait = min(wait, status_s - (now - last_status))
            try:
                batch = await subscription.next_batch(max(wait, 0))
            except TimeoutError:
                if time.monotonic() - last_write >= heartbeat_s:
                    yield sse_comment("heartbeat")
                    last_write = time.monotonic()
                continue
            frames: list[bytes] = []
            for event in batch:
                if isinstance(event.body, handoff_events.Requested):
                    waiting, last_status = True, 0.0  # its position goes out next
                    continue
                if isinstance(event.body, handoff_events.AgentJoined | handoff_events.HandedBack):
                    waiting = False
                frame = _conversation_frame(event)
                if frame is not None:
                    frames.append(frame)
                if event.body.type in _ENDS_STREAM:
                    yield b"".join(frames)
                    return
            if frames:
                yield b"".join(frames)
                last_write = time.monotonic()
