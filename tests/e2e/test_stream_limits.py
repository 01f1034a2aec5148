"""Heartbeats, the generation timeout, Stop, and the relay's single Redis connection."""

import asyncio

import pytest
import redis

from tests.e2e.client import ChatClient
from tests.e2e.conftest import running_stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def slow_stack():
    # A slow engine (about 4 tokens/s) with short intervals, so limits show within seconds.
    yield from running_stack(
        SIMULATED_DECODE_BASE_S="0.25",
        SIMULATED_OUTPUT_TOKENS="400",
        SSE_HEARTBEAT_S="0.5",
        GENERATION_TIMEOUT_S="3",
        INFERENCE_MAX_NUM_SEQS="2",
        VIP_RESERVED_SLOTS="0",
    )


def test_a_generation_running_past_the_timeout_ends_with_a_timeout_error_and_is_stored(slow_stack):
    async def scenario():
        async with ChatClient(slow_stack.base_url) as guest:
            conversation = await guest.open_page()
            request_id = await guest.ask(conversation, "Tell me everything")
            return request_id, await guest.stream(request_id)

    request_id, result = asyncio.run(scenario())
    assert result.terminal.event == "error"
    assert result.terminal.data["code"] == "timeout"
    assert 0 < len(result.of("token")) < 400
    [(status, content)] = slow_stack.count_assistant_messages(request_id)
    assert (status, content) == ("error", result.text)


def test_a_quiet_stream_sends_heartbeat_comments(slow_stack):
    async def scenario():
        async with ChatClient(slow_stack.base_url) as guest:
            # Occupy both slots so the third request waits in the queue, silent but for status.
            conversations = [await guest.new_conversation() for _ in range(3)]
            request_ids = [await guest.ask(c, "Hello") for c in conversations]
            waiting = await guest.stream(request_ids[2], stop_after_s=1.6)
            for request_id in request_ids:
                await guest.cancel(request_id)
            return waiting

    waiting = asyncio.run(scenario())
    assert "heartbeat" in waiting.comments
    statuses = waiting.of("status")
    assert statuses and statuses[0].data["state"] == "queued"
    assert statuses[0].data["position"] >= 1


def test_stop_ends_the_answer_as_cancelled_and_keeps_what_was_said(slow_stack):
    async def scenario():
        async with ChatClient(slow_stack.base_url) as guest:
            conversation = await guest.open_page()
            request_id = await guest.ask(conversation, "A long story please")
            first = await guest.stream(request_id, stop_after_tokens=3)
            assert (await guest.cancel(request_id)).status_code == 202
            rest = await guest.stream(request_id, last_event_id=first.last_id)
            return request_id, first, rest

    request_id, first, rest = asyncio.run(scenario())
    assert rest.terminal.event == "done"
    assert rest.terminal.data["finish_reason"] == "cancelled"
    [(status, content)] = slow_stack.count_assistant_messages(request_id)
    assert status == "cancelled"
    assert content == first.text + rest.text


def test_one_redis_connection_serves_all_live_streams_of_a_web_process(slow_stack):
    admin = redis.Redis.from_url(slow_stack.redis.url)

    async def scenario():
        async with ChatClient(slow_stack.base_url) as guest:
            conversations = [await guest.new_conversation() for _ in range(12)]
            request_ids = [await guest.ask(c, "Hi") for c in conversations]
            streams = [
                asyncio.create_task(guest.stream(request_id, stop_after_s=1.5)) for request_id in request_ids
            ]
            await asyncio.sleep(1.0)
            blocked_readers = sum(1 for c in admin.client_list() if c.get("cmd") == "xread")
            await asyncio.gather(*streams)
            for request_id in request_ids:
                await guest.cancel(request_id)
            return blocked_readers

    assert asyncio.run(scenario()) == 1
