"""Result streams: the worker publishes each request's events, the web process follows them.

Each request has one Redis stream (see keys.result). Its entry ids are the SSE event ids, so a
reconnecting client resumes with `Last-Event-ID` and gets exactly the entries after it.

Publishing coalesces: everything emitted while the previous write was in flight goes out in
one script call, and a stream's tokens among it go out as one token event. Following
multiplexes: one blocking XREAD on one connection serves every stream the process follows.
The follower reads other event streams the same way (`ResultFollower.follow`: a conversation's
hand-off events, the inbox's), each through the codec of the app that writes it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Generic, Protocol, TypeVar

import redis
import redis.asyncio as aioredis
from django.conf import settings

from scheduler import keys, metrics
from scheduler.generation import (
    Done,
    Error,
    EventBody,
    Reset,
    Token,
    TokenLogprob,
    event_decode,
    event_encode,
)
from scheduler.queues import Job
from scheduler.redis import async_script, new_async_redis

logger = logging.getLogger(__name__)

# ASCII digits only (`\d` takes other scripts' digits, which Redis refuses), each part a u64.
_ENTRY_ID = re.compile(r"([0-9]{1,20})-([0-9]{1,20})")
_MAX_ID_PART = 2**64 - 1
_RETRY_DELAYS_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)


def parse_event_id(raw: str | None) -> str:
    """A Last-Event-ID to resume after, in Redis's form; anything Redis would refuse as a stream
    id (malformed, or a part above 2^64-1) starts from the beginning, "0-0"."""
    match = _ENTRY_ID.fullmatch(raw) if raw else None
    if match is None:
        return "0-0"
    ms, seq = (int(part) for part in match.groups())
    if ms > _MAX_ID_PART or seq > _MAX_ID_PART:
        return "0-0"
    return f"{ms}-{seq}"


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq)


STREAM_UNREADABLE_MESSAGE = "Sorry, this answer can no longer be read. Please send your message again."


class ResultEvent:
    """One entry of a result stream: its id (the SSE event id), its type, and its data as the
    stream holds it (event_encode's JSON), which a relay can send on without encoding it again.

    The event itself (`body`) is decoded when first asked for, and a token's only then: the
    chat's relay sends tokens on as stored, and decoding each one cost the web process a tenth
    of its time relaying 1000 streams. Other events are checked as they arrive (`from_fields`)."""

    __slots__ = ("_body", "data", "id", "type")

    def __init__(self, entry_id: str, kind: str, data: str, body: EventBody | None = None) -> None:
        self.id = entry_id
        self.type = kind
        self.data = data
        self._body = body

    @property
    def body(self) -> EventBody:
        """The event; a token whose data cannot be read (only a fault could store one) reads
        as the error that ends its stream, as any other unreadable entry does."""
        if self._body is None:
            try:
                self._body = event_decode(self.type, json.loads(self.data))
            except (KeyError, TypeError, ValueError):
                self._body = Error(code="stream_unreadable", message=STREAM_UNREADABLE_MESSAGE)
        return self._body

    @classmethod
    def from_fields(cls, entry_id: str, fields: list[str]) -> ResultEvent:
        """An entry as XREAD returns it: `[field, value, ...]`. Raises KeyError or ValueError
        for an entry that is not an event (a token's data is checked when read, `body`)."""
        entry = dict(zip(fields[::2], fields[1::2], strict=True))
        event = cls(entry_id, entry["type"], entry["data"])
        if event.type != Token.type:
            event._body = event_decode(event.type, json.loads(event.data))
        return event

    @classmethod
    def of(cls, entry_id: str, body: EventBody) -> ResultEvent:
        """An event that no stream holds (the follower's own `error`)."""
        kind, data = event_encode(body)
        return cls(entry_id, kind, data, body)


# One call writes a whole batch: the per-command cost of a pipeline (packing, parsing a reply
# per entry) is what limits a worker streaming to thousands of clients.
# A batch is written at most once: a retry after a reply lost to a broken connection must not
# append the same tokens again, so the script records the publisher's last batch number and a
# batch it has already written is skipped. Script and record are one atomic step.
_PUBLISH = """
-- KEYS: the publisher's last-batch record, then the stream of each event
-- ARGV: ttl_s, batch number, then (type, data) per event
if redis.call('GET', KEYS[1]) == ARGV[2] then return 0 end
for i = 2, #KEYS do
  local kind = ARGV[2 * i - 1]
  redis.call('XADD', KEYS[i], '*', 'type', kind, 'data', ARGV[2 * i])
  if kind == 'start' or kind == 'done' or kind == 'error' then
    redis.call('EXPIRE', KEYS[i], ARGV[1])
  end
end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[1])
return #KEYS - 1
"""


class _JoinedToken:
    """A stream's token event not yet written, which the stream's next tokens join."""

    __slots__ = ("logprobs", "seq", "texts", "tokens")

    def __init__(self, token: Token, seq: int) -> None:
        self.seq = seq
        self.texts = [token.text]
        self.tokens = token.tokens
        self.logprobs: list[TokenLogprob] | None = None if token.logprobs is None else list(token.logprobs)

    def joins(self, token: Token) -> bool:
        """Whether `token` can be told as more of this one: not a tool-call parser's piece
        (those are written as the parser made them), logprobs asked for by both or neither."""
        return token.parsed is None and (token.logprobs is None) == (self.logprobs is None)

    def join(self, token: Token) -> None:
        self.texts.append(token.text)
        self.tokens += token.tokens
        if self.logprobs is not None and token.logprobs is not None:
            self.logprobs += token.logprobs

    def token(self) -> Token:
        logprobs = None if self.logprobs is None else tuple(self.logprobs)
        return Token(seq=self.seq, text="".join(self.texts), tokens=self.tokens, logprobs=logprobs)


class ResultPublisher:
    """Worker side. `emit` buffers; a single task writes each buffer in one script call.

    A stream's tokens emitted while the previous write is in flight join its last token event
    in the buffer, as vLLM joins a request's outputs when its reader falls behind: when tokens
    come faster than Redis and the web processes take them (thousands of streams at once), each
    stream gets one entry a write instead of one a token, which every part after this one reads,
    parses and relays. Tokens are numbered by the emitter (`seq`); one that joins another frees
    its number, and the stream's later tokens move down to keep the numbers without a gap."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self._publish = async_script(client, _PUBLISH)
        self._batch_key = keys.publisher_batch(uuid.uuid4().hex)
        self._batches = 0
        self._buffer: list[tuple[str, EventBody | _JoinedToken]] = []
        # Per stream: its last event in the buffer when that is a token that later ones may join.
        self._open: dict[str, _JoinedToken] = {}
        # Per stream: how many of its tokens joined others since its numbering began.
        self._joined: dict[str, int] = {}
        self._written: asyncio.Future[None] | None = None
        self._wakeup = asyncio.Event()

    def emit(self, model: str, request_id: str, body: EventBody) -> asyncio.Future[None]:
        """Queue an event; the returned future resolves once it is in Redis."""
        stream = keys.result(model, request_id)
        if isinstance(body, Token):
            self._token_buffer(stream, body)
        else:
            self._open.pop(stream, None)
            if isinstance(body, Reset | Done | Error):  # the emitter numbers tokens from 0 again
                self._joined.pop(stream, None)
            self._buffer.append((stream, body))
        if self._written is None:
            self._written = asyncio.get_running_loop().create_future()
        self._wakeup.set()
        return self._written

    def _token_buffer(self, stream: str, token: Token) -> None:
        joined = self._open.get(stream)
        if joined is not None and joined.joins(token):
            joined.join(token)
            self._joined[stream] = self._joined.get(stream, 0) + 1
            return
        seq = token.seq - self._joined.get(stream, 0)
        if token.parsed is not None:
            self._open.pop(stream, None)
            self._buffer.append((stream, dataclasses.replace(token, seq=seq)))
            return
        self._open[stream] = _JoinedToken(token, seq)
        self._buffer.append((stream, self._open[stream]))

    def forget(self, model: str, request_id: str) -> None:
        """The request left this worker without an end (its job failed here, or went back to
        the queue): whoever answers it next numbers its tokens from a reset."""
        self._joined.pop(keys.result(model, request_id), None)

    async def run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            buffered, written = self._buffer, self._written
            self._buffer, self._written = [], None
            self._open.clear()
            batch = [
                (stream, *event_encode(body.token() if isinstance(body, _JoinedToken) else body))
                for stream, body in buffered
            ]
            await self._write(batch)
            if written is not None and not written.done():
                written.set_result(None)

    async def _write(self, batch: list[tuple[str, str, str]]) -> None:
        """Write one batch, retrying through a Redis restart: tokens are late, never lost."""
        self._batches += 1
        args: list[str | int] = [settings.RESULT_TTL_S, self._batches]
        for _, kind, data in batch:
            args += [kind, data]
        streams = [self._batch_key, *(stream for stream, _, _ in batch)]
        attempt = 0
        while True:
            try:
                await self._publish(keys=streams, args=args)
                return
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                delay = _RETRY_DELAYS_S[min(attempt, len(_RETRY_DELAYS_S) - 1)]
                logger.warning("publishing %d events failed (%s); retrying in %.2fs", len(batch), exc, delay)
                attempt += 1
                await asyncio.sleep(delay)


class StreamEntry(Protocol):
    """What a followed stream's entries become: each one knows its id (the SSE event id)."""

    id: str


EntryT = TypeVar("EntryT", bound=StreamEntry)


class StreamCodec(Protocol[EntryT]):
    """How a followed stream's entries are read, and how the follower tells its reader that the
    stream failed (an entry of the stream's own kind, so every reader has one way to end)."""

    def parse(self, entry_id: str, fields: list[str]) -> EntryT:
        """An entry as XREAD returns it: `[field, value, ...]`; KeyError or ValueError when it
        is not one of the stream's events."""
        ...

    def failure(self, entry_id: str, code: str, message: str) -> EntryT: ...


class _ResultEvents:
    """The codec of result streams."""

    def parse(self, entry_id: str, fields: list[str]) -> ResultEvent:
        return ResultEvent.from_fields(entry_id, fields)

    def failure(self, entry_id: str, code: str, message: str) -> ResultEvent:
        return ResultEvent.of(entry_id, Error(code=code, message=message))


RESULT_EVENTS = _ResultEvents()


class _Subscription(Generic[EntryT]):
    def __init__(self, key: str, after_id: str, codec: StreamCodec[EntryT]) -> None:
        self.key = key
        self.cursor = after_id
        self.codec = codec
        self._pending: list[EntryT] = []
        self._arrived = asyncio.Event()

    def fail(self, code: str, message: str) -> None:
        """End the subscription with its stream's failure event (for a result stream, an
        `error` event, as if the worker had published it): every reader already turns that
        into a clear outcome for its client."""
        self._pending.append(self.codec.failure(self.cursor, code, message))
        self._arrived.set()

    def deliver(self, entries: list[list]) -> None:
        """Entries as XREAD returns them: `[entry id, [field, value, ...]]`."""
        # The entries are in order and follow the stream's oldest cursor: only the first few
        # can be ones this subscriber already has (when another one resumed from further back).
        cursor = _id_key(self.cursor)
        start = 0
        while start < len(entries) and _id_key(entries[start][0]) <= cursor:
            start += 1
        for entry_id, fields in entries[start:]:
            self._pending.append(self.codec.parse(entry_id, fields))
            self.cursor = entry_id
        if self._pending:
            self._arrived.set()

    async def next_batch(self, timeout_s: float) -> list[EntryT]:
        """Every event that has arrived, waiting up to `timeout_s` for the first (else
        TimeoutError): a reader that fell behind catches up in one write, not one per token."""
        if not self._pending:
            self._arrived.clear()
            async with asyncio.timeout(timeout_s):
                await self._arrived.wait()
        batch, self._pending = self._pending, []
        return batch


RELAY_FAILED_MESSAGE = "Sorry, we lost track of this answer. Reload the page to pick it up again."


def _new_wake_key() -> str:
    return keys.relay_wake(uuid.uuid4().hex)


class ResultFollower:
    """Web side: one per event loop. A single connection blocks on XREAD over every followed
    stream plus a private wake-up stream, which new subscriptions poke. Result streams
    (`subscribe`) and other event streams (`follow`) share it."""

    BLOCK_MS = 5000
    BATCH = 512

    def __init__(self) -> None:
        self._subs: dict[str, list[_Subscription]] = {}
        self._wake_key = _new_wake_key()
        self._wake_cursor = "0-0"
        self._reader: aioredis.Redis | None = None
        self._poker: aioredis.Redis | None = None
        self._task: asyncio.Task[None] | None = None

    @asynccontextmanager
    async def subscribe(
        self, *, model: str, request_id: str, after_id: str
    ) -> AsyncIterator[_Subscription[ResultEvent]]:
        """Follow one request's events; while subscribed, the request counts as watched."""
        async with self.follow(
            key=keys.result(model, request_id),
            after_id=after_id,
            codec=RESULT_EVENTS,
            watch_key=keys.watchers(model, request_id),
        ) as sub:
            metrics.STREAM_CLIENTS.inc()
            try:
                yield sub
            finally:
                metrics.STREAM_CLIENTS.dec()

    @asynccontextmanager
    async def follow(
        self, *, key: str, after_id: str, codec: StreamCodec[EntryT], watch_key: str | None = None
    ) -> AsyncIterator[_Subscription[EntryT]]:
        """Follow the stream at `key` from after `after_id`, its entries read by `codec`; with a
        `watch_key`, count this reader as one of the stream's watchers while it follows."""
        if parse_event_id(after_id) != after_id:
            raise ValueError(f"not a stream id in Redis's form: {after_id!r}")
        sub = _Subscription(key, after_id, codec)
        self._subs.setdefault(sub.key, []).append(sub)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="result-follower")
            await self._watch(watch_key, +1)
        else:
            await self._watch(watch_key, +1, poke=True)
        try:
            yield sub
        finally:
            subs = self._subs.get(sub.key, [])
            if sub in subs:
                subs.remove(sub)
            if not subs:
                self._subs.pop(sub.key, None)
            await self._watch(watch_key, -1)

    async def _watch(self, watch_key: str | None, change: int, *, poke: bool = False) -> None:
        """Count the clients attached to a request; when the last leaves, note the time. `poke`:
        wake the reader in the same round trip, to read a stream it has just been given."""
        if watch_key is None and not poke:
            return
        if self._poker is None:
            self._poker = new_async_redis()
        try:
            async with self._poker.pipeline(transaction=False) as pipe:
                if poke:
                    self._poke_into(pipe)
                if watch_key is not None:
                    pipe.hincrby(watch_key, "clients", change)
                    if change < 0:
                        pipe.hset(watch_key, "since", time.time())
                    pipe.expire(watch_key, settings.RESULT_TTL_S)
                replies = await pipe.execute(raise_on_error=False)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            replies = [exc]
        if any(isinstance(reply, redis.RedisError) for reply in replies):
            if watch_key is None:
                logger.warning("could not wake the follower for a new stream")  # it reads it when back
            else:
                logger.warning(
                    "could not count a client %s %s", "leaving" if change < 0 else "joining", watch_key
                )

    @property
    def followed_streams(self) -> int:
        return len(self._subs)

    async def close(self) -> None:
        """Close its connections, on the loop that opened them (a connection left to the garbage
        collector after its loop closed fails to close: "Event loop is closed")."""
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
        for client in (self._reader, self._poker):
            if client is not None:
                await client.aclose(close_connection_pool=True)
        self._reader = self._poker = None

    def _poke_into(self, pipe: aioredis.client.Pipeline) -> None:
        # Lost if the reader is reconnecting (or replacing its wake-up stream): it reads every
        # stream it follows anyway when it is back.
        pipe.xadd(self._wake_key, {"w": 1}, maxlen=16, approximate=False)
        pipe.expire(self._wake_key, 3600)

    async def _run(self) -> None:
        try:
            await self._follow()
        except Exception:
            # Whatever went wrong, nobody is left waiting on a follower that is gone; the next
            # subscription starts a fresh one.
            logger.exception("following result streams stopped")
            for subs in self._subs.values():
                for sub in subs:
                    sub.fail("relay_failed", RELAY_FAILED_MESSAGE)
            self._subs.clear()

    async def _follow(self) -> None:
        if self._reader is None:
            self._reader = new_async_redis(single_connection=True, socket_timeout=self.BLOCK_MS / 1000 + 5)
        attempt = 0
        while self._subs:
            streams = {self._wake_key: self._wake_cursor}
            for key, subs in self._subs.items():
                streams[key] = min((s.cursor for s in subs), key=_id_key)
            try:
                reply = await self._read(streams)
                attempt = 0
            except redis.RedisError as exc:
                # Redis refused the read: one stream's fault (a key of another type, say) must
                # not stop every other stream of this process. Otherwise wait it out.
                if isinstance(exc, redis.ResponseError) and await self._drop_unreadable(streams):
                    continue
                delay = _RETRY_DELAYS_S[min(attempt, len(_RETRY_DELAYS_S) - 1)]
                logger.warning("following result streams failed (%s); retrying in %.2fs", exc, delay)
                attempt += 1
                await asyncio.sleep(delay)
                continue
            for key, entries in reply:
                if key == self._wake_key:
                    self._wake_cursor = entries[-1][0]
                    continue
                try:
                    for sub in self._subs.get(key, []):
                        sub.deliver(entries)
                except (KeyError, ValueError) as exc:
                    logger.error("result stream %s holds an entry that is not an event: %s", key, exc)
                    self._end_subscriptions(key)

    async def _read(self, streams: dict[str, str]) -> list:
        """One blocking XREAD over every followed stream, sent and read on the reader's own
        connection: `[(key, [[entry id, [field, value, ...]], ...]), ...]`, or [] when nothing
        came within BLOCK_MS. Not through redis-py's command layer, whose reply callback turns
        each entry's fields into a dict: with its packing (before _PackedInC) a third of the web
        process's time relaying 1000 streams. The connection drops itself on an error mid-reply,
        as under the command layer, and reconnects on the next read (through the Sentinels,
        when there are some)."""
        assert self._reader is not None
        if self._reader.connection is None:  # its one connection, reconnected on use after that
            await self._reader.initialize()
        connection = self._reader.connection
        await connection.send_command(
            "XREAD", "COUNT", self.BATCH, "BLOCK", self.BLOCK_MS, "STREAMS", *streams, *streams.values()
        )
        reply = await connection.read_response()
        # RESP3 (redis-py's default) answers with a map of stream to entries, RESP2 with pairs.
        return list(reply.items()) if isinstance(reply, dict) else reply or []

    async def _drop_unreadable(self, streams: dict[str, str]) -> bool:
        """Read each stream on its own and end the subscriptions of those Redis refuses.
        True when at least one was found (the others can be read again at once)."""
        if self._poker is None:
            self._poker = new_async_redis()
        try:
            async with self._poker.pipeline(transaction=False) as pipe:
                for key, cursor in streams.items():
                    pipe.xread({key: cursor}, count=1)
                replies = await pipe.execute(raise_on_error=False)
        except (redis.ConnectionError, redis.TimeoutError):
            return False  # Redis went away meanwhile: the read is retried like any other
        found = False
        for key, reply in zip(streams, replies, strict=True):
            if not isinstance(reply, redis.ResponseError):
                continue
            found = True
            logger.error("result stream %s cannot be read: %s", key, reply)
            if key == self._wake_key:
                self._wake_key, self._wake_cursor = _new_wake_key(), "0-0"
            else:
                self._end_subscriptions(key)
        return found

    def _end_subscriptions(self, key: str) -> None:
        for sub in self._subs.pop(key, []):
            sub.fail("stream_unreadable", STREAM_UNREADABLE_MESSAGE)


async def abandoned_request_ids(client: aioredis.Redis, jobs: list[Job]) -> set[str]:
    """Requests whose clients all left longer ago than the request's disconnect grace.

    A request no client ever attached to is never abandoned, nor one without a grace (batch).
    """
    async with client.pipeline(transaction=False) as pipe:
        for job in jobs:
            pipe.hmget(keys.watchers(job.model, job.request_id), "clients", "since")
        replies = await pipe.execute()
    now = time.time()
    abandoned = set()
    for job, (clients, since) in zip(jobs, replies, strict=True):
        grace = job.generation.disconnect_grace_s
        if grace is None:
            continue
        if clients is not None and int(clients) <= 0 and since and now - float(since) >= grace:
            abandoned.add(job.request_id)
    return abandoned


_followers: dict[asyncio.AbstractEventLoop, ResultFollower] = {}
# Each loop's follower closer (the loop itself keeps only a weak reference to a task).
_closers: set[asyncio.Task[None]] = set()


def result_follower() -> ResultFollower:
    loop = asyncio.get_running_loop()
    if loop not in _followers:
        _followers[loop] = ResultFollower()
        closer = loop.create_task(_close_when_loop_ends(loop), name="result-follower-closer")
        _closers.add(closer)
        closer.add_done_callback(_closers.discard)
    return _followers[loop]


async def _close_when_loop_ends(loop: asyncio.AbstractEventLoop) -> None:
    """A loop run for one piece of work (asyncio.run: a quality run's in Celery, a test
    client's) cancels its tasks before it closes: the follower then closes its connections
    while the loop still can, and is forgotten. Daphne's loop lasts as long as the process."""
    try:
        await asyncio.Event().wait()
    finally:
        await _followers.pop(loop).close()
