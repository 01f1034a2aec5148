import asyncio

from scheduler.generation import Done, Token
from scheduler.redis import new_async_redis
from scheduler.results import ResultFollower, ResultPublisher, parse_event_id


def test_malformed_event_ids_resume_from_the_beginning():
    assert parse_event_id("1700000000000-3") == "1700000000000-3"
    for raw in (None, "", "abc", "12", "1-2-3", "-1", "1 -2"):
        assert parse_event_id(raw) == "0-0"


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
            async with follower.subscribe(variant="v", request_id="a", after_id="0-0") as early:
                for n in range(3):
                    publisher.emit("v", "a", Token(seq=n, text=f"t{n} "))
                first_three = await _collect(early, "token")
                while len(first_three) < 3:
                    first_three += await early.next_batch(5)
                async with follower.subscribe(
                    variant="v", request_id="a", after_id=first_three[0].id
                ) as late:
                    await publisher.emit("v", "a", Done(finish_reason="stop"))
                    late_events = await _collect(late, "done")
                early_rest = await _collect(early, "done")
            return first_three, early_rest, late_events, follower.followed_streams
        finally:
            publishing.cancel()
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
            async with follower.subscribe(variant="v", request_id="idle", after_id="0-0"):
                await asyncio.sleep(0.2)  # the reader is now blocked on the idle stream
                async with follower.subscribe(variant="v", request_id="busy", after_id="0-0") as busy:
                    await publisher.emit("v", "busy", Done(finish_reason="stop"))
                    started = asyncio.get_running_loop().time()
                    events = await _collect(busy, "done")
                    waited = asyncio.get_running_loop().time() - started
            return events, waited
        finally:
            publishing.cancel()
            await client.aclose()

    events, waited = asyncio.run(scenario())
    assert [e.type for e in events] == ["done"]
    # Not stuck behind the reader's 5 s block: the new subscription woke it.
    assert waited < ResultFollower.BLOCK_MS / 1000
