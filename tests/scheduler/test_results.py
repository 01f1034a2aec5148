import asyncio
import json
import time

import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import example, given
from hypothesis import strategies as st

from scheduler import keys
from scheduler.generation import (
    AnswerFold,
    Done,
    ParsedDelta,
    Reset,
    Start,
    Token,
    TokenLogprob,
    event_decode,
)
from scheduler.redis import new_async_redis, sync_redis
from scheduler.results import ResultFollower, ResultPublisher, parse_event_id, result_follower

U64_MAX = 2**64 - 1


def test_malformed_event_ids_resume_from_the_beginning():
    assert parse_event_id("1700000000000-3") == "1700000000000-3"
    for raw in (None, "", "abc", "12", "1-2-3", "-1", "1 -2", "1-2\n", "\u0661-2"):
        assert parse_event_id(raw) == "0-0"


def test_ids_beyond_what_redis_takes_resume_from_the_beginning():
    assert parse_event_id(f"{U64_MAX}-{U64_MAX}") == f"{U64_MAX}-{U64_MAX}"
    assert parse_event_id("99999999999999999999-0") == "0-0"
    assert parse_event_id(f"0-{U64_MAX + 1}") == "0-0"


_parts = st.one_of(
    st.integers(min_value=0, max_value=2**70).map(str),
    st.text(alphabet="0123456789", min_size=1, max_size=22),  # leading zeros, 21-22 digits
    st.text(max_size=4),
)


@given(raw=st.one_of(st.none(), st.text(), st.builds(lambda a, b: f"{a}-{b}", _parts, _parts)))
@example(raw="99999999999999999999-0")
@example(raw="007-0")
def test_any_last_event_id_gives_an_id_redis_accepts_or_the_beginning(raw):
    parsed = parse_event_id(raw)
    # Redis is the judge: the id is read after as a stream cursor, as the follower does.
    try:
        sync_redis().xread({"llm:{v}:result:probe": parsed}, count=1)
    except redis.ResponseError as exc:
        pytest.fail(f"{raw!r} gave {parsed!r}, which Redis refuses: {exc}")
    if parsed != "0-0":
        ms, seq = raw.split("-")
        assert (int(ms), int(seq)) == tuple(int(part) for part in parsed.split("-"))


async def _collect(subscription, until: str):
    events = []
    while not events or events[-1].type != until:
        events += await subscription.next_batch(5)
    return events


def test_followers_get_every_event_in_order_from_their_own_cursor():
    async def scenario():
        client = new_async_redis()
        publisher = ResultPublisher(client)
        publishing = asyncio.create_task(publisher.run())
        follower = ResultFollower()
        try:
            async with follower.subscribe(model="v", request_id="a", after_id="0-0") as early:
                for n in range(3):
                    await publisher.emit("v", "a", Token(seq=n, text=f"t{n} "))  # a write each
                first_three = await _collect(early, "token")
                while len(first_three) < 3:
                    first_three += await early.next_batch(5)
                async with follower.subscribe(model="v", request_id="a", after_id=first_three[0].id) as late:
                    await publisher.emit("v", "a", Done(finish_reason="stop"))
                    late_events = await _collect(late, "done")
                early_rest = await _collect(early, "done")
            return first_three, early_rest, late_events, follower.followed_streams
        finally:
            publishing.cancel()
            await follower.close()
            await client.aclose()

    first_three, early_rest, late_events, followed_after = asyncio.run(scenario())
    assert [e.body.seq for e in first_three] == [0, 1, 2]
    assert [e.type for e in early_rest] == ["done"]
    # The late subscriber resumed after the first token: it sees tokens 1 and 2, then done.
    assert [e.type for e in late_events] == ["token", "token", "done"]
    assert [e.body.seq for e in late_events[:2]] == [1, 2]
    assert followed_after == 0


def test_one_follower_serves_many_streams_and_wakes_for_new_subscriptions():
    async def scenario():
        client = new_async_redis()
        publisher = ResultPublisher(client)
        publishing = asyncio.create_task(publisher.run())
        follower = ResultFollower()
        try:
            async with follower.subscribe(model="v", request_id="idle", after_id="0-0"):
                await asyncio.sleep(0.2)  # the reader is now blocked on the idle stream
                async with follower.subscribe(model="v", request_id="busy", after_id="0-0") as busy:
                    await publisher.emit("v", "busy", Done(finish_reason="stop"))
                    started = asyncio.get_running_loop().time()
                    events = await _collect(busy, "done")
                    waited = asyncio.get_running_loop().time() - started
            return events, waited
        finally:
            publishing.cancel()
            await follower.close()
            await client.aclose()

    events, waited = asyncio.run(scenario())
    assert [e.type for e in events] == ["done"]
    # Not stuck behind the reader's 5 s block: the new subscription woke it.
    assert waited < ResultFollower.BLOCK_MS / 1000


def test_a_stream_redis_refuses_to_read_ends_alone_with_an_error_and_the_others_keep_flowing():
    sync_redis().set(keys.result("v", "wrong-type"), "not a stream")

    async def scenario():
        client = new_async_redis()
        publisher = ResultPublisher(client)
        publishing = asyncio.create_task(publisher.run())
        follower = ResultFollower()
        try:
            async with follower.subscribe(model="v", request_id="fine", after_id="0-0") as fine:
                async with follower.subscribe(model="v", request_id="wrong-type", after_id="0-0") as bad:
                    bad_events = await _collect(bad, "error")
                await publisher.emit("v", "fine", Done(finish_reason="stop"))
                fine_events = await _collect(fine, "done")
            return bad_events, fine_events
        finally:
            publishing.cancel()
            await follower.close()
            await client.aclose()

    bad_events, fine_events = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert [e.type for e in bad_events] == ["error"]
    assert bad_events[0].body.code == "stream_unreadable"
    assert bad_events[0].body.message
    assert [e.type for e in fine_events] == ["done"]


def test_an_entry_that_is_not_an_event_ends_only_its_own_stream():
    sync_redis().xadd(keys.result("v", "corrupt"), {"garbage": "1"})

    async def scenario():
        client = new_async_redis()
        publisher = ResultPublisher(client)
        publishing = asyncio.create_task(publisher.run())
        follower = ResultFollower()
        try:
            async with (
                follower.subscribe(model="v", request_id="fine", after_id="0-0") as fine,
                follower.subscribe(model="v", request_id="corrupt", after_id="0-0") as bad,
            ):
                bad_events = await _collect(bad, "error")
                await publisher.emit("v", "fine", Done(finish_reason="stop"))
                fine_events = await _collect(fine, "done")
            return bad_events, fine_events
        finally:
            publishing.cancel()
            await follower.close()
            await client.aclose()

    bad_events, fine_events = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert [(e.type, e.body.code) for e in bad_events] == [("error", "stream_unreadable")]
    assert [e.type for e in fine_events] == ["done"]


def test_a_token_whose_data_cannot_be_read_reads_as_the_error_that_ends_its_stream():
    """Tokens are decoded only when a reader asks (the chat's relay sends them on as stored): one
    that cannot be read gives such a reader the same clear end as any unreadable entry."""
    stream = keys.result("v", "garbled")
    sync_redis().xadd(stream, {"type": "token", "data": '{"seq": 0, "text": "Fine"}'})
    sync_redis().xadd(stream, {"type": "token", "data": "{not json"})

    async def scenario():
        follower = ResultFollower()
        try:
            async with follower.subscribe(model="v", request_id="garbled", after_id="0-0") as sub:
                events = []
                while len(events) < 2:
                    events += await sub.next_batch(5)
                return [event.body for event in events]
        finally:
            await follower.close()

    fine, garbled = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert fine.text == "Fine"
    assert (garbled.type, garbled.code) == ("error", "stream_unreadable")


def test_subscribers_of_a_follower_that_dies_get_an_error_and_a_new_subscription_follows_again(monkeypatch):
    class Broken(Exception):
        pass

    real_read = ResultFollower._read
    failures = iter([Broken("unexpected")])

    async def read_failing_once(self, *args, **kwargs):
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return await real_read(self, *args, **kwargs)

    monkeypatch.setattr(ResultFollower, "_read", read_failing_once)

    async def scenario():
        client = new_async_redis()
        publisher = ResultPublisher(client)
        publishing = asyncio.create_task(publisher.run())
        follower = ResultFollower()
        try:
            async with follower.subscribe(model="v", request_id="first", after_id="0-0") as first:
                first_events = await _collect(first, "error")
            async with follower.subscribe(model="v", request_id="second", after_id="0-0") as second:
                await publisher.emit("v", "second", Done(finish_reason="stop"))
                second_events = await _collect(second, "done")
            return first_events, second_events
        finally:
            publishing.cancel()
            await follower.close()
            await client.aclose()

    first_events, second_events = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert [(e.type, e.body.code) for e in first_events] == [("error", "relay_failed")]
    assert [e.type for e in second_events] == ["done"]


def test_a_follower_that_cannot_reach_redis_at_first_waits_for_it_instead_of_failing(monkeypatch):
    """Redis unreachable when the first customer of a web process opens a stream: the stream
    gets its answer once Redis answers, not an error."""
    real_initialize = aioredis.Redis.initialize
    refusals = iter([redis.ConnectionError("Connection refused")])

    async def refused_once(self):
        refusal = next(refusals, None) if self.single_connection_client else None  # the reader's
        if refusal is not None:
            raise refusal
        return await real_initialize(self)

    monkeypatch.setattr(aioredis.Redis, "initialize", refused_once)

    async def scenario():
        client = new_async_redis()
        publisher = ResultPublisher(client)
        publishing = asyncio.create_task(publisher.run())
        follower = ResultFollower()
        try:
            async with follower.subscribe(model="v", request_id="early", after_id="0-0") as early:
                await publisher.emit("v", "early", Done(finish_reason="stop"))
                return await _collect(early, "done")
        finally:
            publishing.cancel()
            await follower.close()
            await client.aclose()

    events = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert [e.type for e in events] == ["done"]
    assert next(refusals, None) is None  # the refusal did happen


def test_a_batch_whose_reply_was_lost_is_not_written_twice_when_retried():
    """The connection broke after Redis wrote the batch: the retry must not repeat its tokens."""

    async def scenario():
        client = new_async_redis()
        publisher = ResultPublisher(client)
        real_publish = publisher._publish
        replies_lost = 0

        async def reply_lost_once(**kwargs):
            nonlocal replies_lost
            written = await real_publish(**kwargs)
            if replies_lost == 0:
                replies_lost += 1
                raise redis.ConnectionError("connection reset after the write")
            return written

        publisher._publish = reply_lost_once
        publishing = asyncio.create_task(publisher.run())
        try:
            for n in range(3):
                await publisher.emit("v", "lost-reply", Token(seq=n, text=f"t{n}"))
            await publisher.emit("v", "lost-reply", Done(finish_reason="stop"))
            # Later batches are written as usual.
            await publisher.emit("v", "next", Done(finish_reason="stop"))
        finally:
            publishing.cancel()
            await client.aclose()
        return replies_lost

    assert asyncio.run(scenario()) == 1
    store = sync_redis()
    kinds = [fields["type"] for _, fields in store.xrange(keys.result("v", "lost-reply"))]
    assert kinds == ["token", "token", "token", "done"]
    assert [fields["type"] for _, fields in store.xrange(keys.result("v", "next"))] == ["done"]


def _stream_events(request_id: str) -> list:
    entries = sync_redis().xrange(keys.result("v", request_id))
    return [event_decode(fields["type"], json.loads(fields["data"])) for _, fields in entries]


def test_tokens_emitted_while_a_write_is_in_flight_go_out_as_one_event_numbered_without_a_gap():
    """Thousands of streams at once: the engine writes faster than Redis and the web take it,
    and each stream gets one entry a write rather than one a token."""

    async def scenario():
        client = new_async_redis()
        publisher = ResultPublisher(client)
        publishing = asyncio.create_task(publisher.run())
        try:
            for request_id in ("a", "b"):
                publisher.emit("v", request_id, Start(worker="w", variant="stable", attempt=1))
            for n in range(3):  # engine steps of both answers before the next write
                publisher.emit("v", "a", Token(seq=n, text=f"a{n} "))
                written = publisher.emit("v", "b", Token(seq=n, text=f"b{n} ", tokens=2))
            await written
            await publisher.emit("v", "a", Token(seq=3, text="a3 "))  # a write of its own
            publisher.emit("v", "a", Token(seq=4, text="a4 "))
            await publisher.emit("v", "a", Token(seq=5, text="a5."))
            publisher.emit("v", "b", Done(finish_reason="stop"))
            await publisher.emit("v", "a", Done(finish_reason="stop"))
        finally:
            publishing.cancel()
            await client.aclose()

    asyncio.run(scenario())
    a = _stream_events("a")
    assert [type(e).__name__ for e in a] == ["Start", "Token", "Token", "Token", "Done"]
    assert [(e.seq, e.text, e.tokens) for e in a[1:4]] == [
        (0, "a0 a1 a2 ", 3),
        (1, "a3 ", 1),
        (2, "a4 a5.", 2),
    ]
    b = _stream_events("b")
    assert [(e.seq, e.text, e.tokens) for e in b if isinstance(e, Token)] == [(0, "b0 b1 b2 ", 6)]
    for events in (a, b):  # what every reader folds: no token lost, none repeated
        fold = AnswerFold().add_all(events)
        assert (fold.skipped, fold.repeated, fold.end) == (0, 0, Done(finish_reason="stop"))
    assert AnswerFold().add_all(a).text == "a0 a1 a2 a3 a4 a5."


def test_joined_tokens_keep_their_logprobs_in_order_and_a_parsers_pieces_stay_apart():
    def logprob(token: str) -> tuple[TokenLogprob, ...]:
        return (TokenLogprob(token=token, logprob=-0.5, bytes=list(token.encode())),)

    async def scenario():
        client = new_async_redis()
        publisher = ResultPublisher(client)
        publishing = asyncio.create_task(publisher.run())
        try:
            publisher.emit("v", "lp", Token(seq=0, text="Yes", logprobs=logprob("Yes")))
            publisher.emit("v", "lp", Token(seq=1, text=".", logprobs=logprob(".")))
            publisher.emit("v", "tool", Token(seq=0, text="[f(", parsed=ParsedDelta()))
            publisher.emit("v", "tool", Token(seq=1, text="x=1", parsed=ParsedDelta()))
            publisher.emit("v", "tool", Token(seq=2, text=")]"))
            publisher.emit("v", "tool", Token(seq=3, text=" "))
            # A reset: the answer starts over, numbered from 0 again.
            publisher.emit("v", "tool", Reset(reason="worker_restarted", attempt=2))
            publisher.emit("v", "tool", Token(seq=0, text="Again"))
            await publisher.emit("v", "tool", Token(seq=1, text="."))
        finally:
            publishing.cancel()
            await client.aclose()

    asyncio.run(scenario())
    [joined] = _stream_events("lp")
    assert (joined.seq, joined.text, joined.tokens) == (0, "Yes.", 2)
    assert [entry.token for entry in joined.logprobs] == ["Yes", "."]
    tool = _stream_events("tool")
    assert [(e.seq, e.text, e.parsed is not None) for e in tool[:3]] == [
        (0, "[f(", True),
        (1, "x=1", True),
        (2, ")] ", False),
    ]
    assert isinstance(tool[3], Reset)
    assert [(e.seq, e.text) for e in tool[4:]] == [(0, "Again.")]


def test_a_follower_on_an_event_loop_that_ends_leaves_no_connection_to_redis_open():
    """A quality run in Celery follows its answers on a loop of its own (asyncio.run): each run
    left the follower's connections open for the life of the worker."""
    before = {client["id"] for client in sync_redis().client_list()}

    async def follow_one_answer():
        client = new_async_redis()
        publisher = ResultPublisher(client)
        publishing = asyncio.create_task(publisher.run())
        try:
            async with result_follower().subscribe(model="v", request_id="q", after_id="0-0") as answer:
                await publisher.emit("v", "q", Done(finish_reason="stop"))
                await _collect(answer, "done")
        finally:
            publishing.cancel()
            await client.aclose(close_connection_pool=True)

    asyncio.run(asyncio.wait_for(follow_one_answer(), 60))

    deadline = time.monotonic() + 10  # a hang guard: Redis drops a closed connection at once
    while (opened := {client["id"] for client in sync_redis().client_list()} - before) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert opened == set()
