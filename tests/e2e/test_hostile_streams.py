"""A stream that Redis refuses to read ends on its own; every other stream of the web process
keeps flowing."""

import asyncio

import pytest
import redis

from scheduler import keys
from tests.e2e.client import ChatClient
from tests.generation_jobs import MODEL

pytestmark = [pytest.mark.e2e, pytest.mark.security]

DEADLINE_S = 90  # a stalled relay sends heartbeats for ever: the test waits this long at most


async def _asked(stack, text: str) -> tuple[ChatClient, str]:
    guest = ChatClient(stack.base_url)
    conversation = await guest.open_page()
    return guest, await guest.ask(conversation, text)


async def _followed(stack, request_id: str, stream: asyncio.Task) -> None:
    """Wait until the web process follows the request's stream (it counts as watched), or the
    stream has already ended."""
    with redis.Redis.from_url(stack.redis.url, decode_responses=True) as client:
        while True:
            if stream.done() or client.hget(keys.watchers(MODEL, request_id), "clients") == "1":
                return
            await asyncio.sleep(0.05)


def test_a_last_event_id_beyond_what_redis_takes_stalls_no_other_stream(stack):
    async def scenario():
        hostile, hostile_request = await _asked(stack, "hostile")
        async with hostile:
            hostile_stream = asyncio.create_task(
                hostile.stream(hostile_request, last_event_id="99999999999999999999-0")
            )
            await _followed(stack, hostile_request, hostile_stream)
            guest, request_id = await _asked(stack, "an ordinary question")
            async with guest:
                ordinary = await guest.stream(request_id)
            return ordinary, await hostile_stream

    ordinary, hostile = asyncio.run(asyncio.wait_for(scenario(), DEADLINE_S))
    assert ordinary.terminal.event == "done"
    assert ordinary.text.startswith("[simulated]")
    # An id Redis would refuse is read as "from the beginning".
    assert hostile.terminal.event == "done"
    assert hostile.text.startswith("[simulated]")


def test_a_result_stream_redis_refuses_to_read_ends_with_an_error_and_others_end_done(stack):
    async def scenario():
        broken_guest, broken_request = await _asked(stack, "to be broken")
        async with broken_guest:
            assert (await broken_guest.stream(broken_request)).terminal.event == "done"
            with redis.Redis.from_url(stack.redis.url) as client:
                client.set(keys.result(MODEL, broken_request), "not a stream any more")
            broken = asyncio.create_task(broken_guest.stream(broken_request))
            await _followed(stack, broken_request, broken)
            guest, request_id = await _asked(stack, "an ordinary question")
            async with guest:
                ordinary = await guest.stream(request_id)
            return ordinary, await broken

    ordinary, broken = asyncio.run(asyncio.wait_for(scenario(), DEADLINE_S))
    assert ordinary.terminal.event == "done"
    assert broken.terminal.event == "error"
    assert broken.terminal.data["code"] == "stream_unreadable"
    assert broken.terminal.data["message"]
