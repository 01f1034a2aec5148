"""Faults with real processes: a killed worker, a drained worker, a restarted Redis, clients
that vanish, and a burst far beyond capacity."""

import asyncio
import contextlib
import json

import pytest
import redis

from tests.e2e.client import ChatClient
from tests.e2e.conftest import running_stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack():
    yield from running_stack(
        INFERENCE_MAX_NUM_SEQS="20",
        VIP_RESERVED_SLOTS="0",
        SIMULATED_DECODE_BASE_S="0.05",
        SIMULATED_OUTPUT_TOKENS="60",  # answers take about 4 s
        JOB_LEASE_S="2",
        STREAM_DISCONNECT_GRACE_S="1",
        WORKER_DRAIN_TIMEOUT_S="20",
        WAIT_SLO_VIP_S="600",
        MAX_WAIT_VIP_S="600",
        # A guest's post is refused past a predicted wait of 30 s: the burst's accepted answers
        # (about 50 of the 500) then take 20 s, not a minute.
        WAIT_SLO_NORMAL_S="15",
        MAX_WAIT_NORMAL_S="30",
    )


def _running_counts(stack) -> list[int]:
    client = redis.Redis.from_url(stack.redis.url, decode_responses=True)
    return [json.loads(client.get(key))["running"] for key in client.scan_iter("llm:worker:*")]


async def _ask_many(stack, count: int, text: str):
    client = ChatClient(stack.base_url)
    await client.login("victor", "victor-demo-pass")
    conversations = [await client.new_conversation() for _ in range(count)]
    request_ids = [await client.ask(c, f"{text} {n}") for n, c in enumerate(conversations)]
    return client, request_ids


def _assert_complete_and_stored_once(stack, results):
    for request_id, result in results:
        assert result.terminal.event == "done", result.terminal
        tokens_after_reset = result.text.split()
        assert tokens_after_reset[:3] == ["[simulated]", "You", "asked:"]
        assert stack.count_assistant_messages(request_id) == [("done", result.text)]


def test_a_killed_worker_s_twenty_answers_are_finished_by_a_new_worker(stack):
    async def scenario():
        client, request_ids = await _ask_many(stack, 20, "Killed mid-answer")
        async with client:
            streams = [asyncio.create_task(client.stream(r)) for r in request_ids]
            await asyncio.sleep(0.8)  # everyone is mid-answer
            [worker] = stack.workers
            stack.kill_worker(worker)
            await asyncio.to_thread(stack.start_worker)
            return list(zip(request_ids, await asyncio.gather(*streams), strict=True))

    results = asyncio.run(scenario())
    _assert_complete_and_stored_once(stack, results)
    assert any(result.of("reset") for _, result in results), "no stream was told to restart"


def test_a_drained_worker_finishes_what_it_runs_and_exits_cleanly(stack):
    async def scenario():
        client, request_ids = await _ask_many(stack, 5, "Drain me")
        async with client:
            streams = [asyncio.create_task(client.stream(r)) for r in request_ids]
            await asyncio.sleep(0.5)
            [worker] = stack.workers
            returncode = await asyncio.to_thread(stack.stop_worker, worker)
            results = await asyncio.gather(*streams)
            await asyncio.to_thread(stack.start_worker)
            return returncode, list(zip(request_ids, results, strict=True))

    returncode, results = asyncio.run(scenario())
    assert returncode == 0
    _assert_complete_and_stored_once(stack, results)
    assert not any(result.of("reset") for _, result in results)


def test_a_redis_restart_with_fifty_requests_queued_loses_none(stack):
    async def scenario():
        client, request_ids = await _ask_many(stack, 50, "Survive a restart")
        async with client:
            streams = [asyncio.create_task(client.stream(r)) for r in request_ids]
            await asyncio.sleep(0.3)
            await asyncio.to_thread(stack.redis.restart, 1.0)
            results = await asyncio.gather(*streams)
            return list(zip(request_ids, results, strict=True))

    results = asyncio.run(scenario())
    assert len(results) == 50
    _assert_complete_and_stored_once(stack, results)


def test_submissions_while_redis_is_down_get_503_with_retry_after(stack):
    async def scenario():
        async with ChatClient(stack.base_url) as guest:
            conversation = await guest.open_page()
            stack.redis.stop()
            try:
                return await guest.post_message(conversation, "anyone?")
            finally:
                stack.redis.start()

    response = asyncio.run(scenario())
    assert response.status_code == 503
    assert int(response.headers["Retry-After"]) >= 1
    stack.wait_ready()


def test_a_client_that_leaves_and_stays_away_is_cancelled_after_the_grace_period(stack):
    async def scenario():
        async with ChatClient(stack.base_url) as guest:
            conversation = await guest.open_page()
            request_id = await guest.ask(conversation, "I will leave")
            first = await guest.stream(request_id, stop_after_tokens=2)
            await asyncio.sleep(3.0)  # grace 1 s, checked every second
            return request_id, first

    request_id, first = asyncio.run(scenario())
    [(status, content)] = stack.count_assistant_messages(request_id)
    assert status == "cancelled"
    assert content.startswith(first.text)
    assert _running_counts(stack) == [0]


def test_a_burst_of_500_from_50_clients_gets_only_202_429_or_503_and_every_202_completes(stack):
    async def guest_with_conversations(guest: ChatClient) -> list[str]:
        await guest.open_page()
        return [await guest.new_conversation() for _ in range(10)]

    async def posts_and_streams(guest: ChatClient, conversations: list[str], n: int):
        responses = await asyncio.gather(*(guest.post_message(c, f"burst {n}") for c in conversations))
        accepted = [r.json()["request_id"] for r in responses if r.status_code == 202]
        streams = await asyncio.gather(*(guest.stream(r) for r in accepted))
        return responses, list(zip(accepted, streams, strict=True))

    async def scenario():
        async with contextlib.AsyncExitStack() as guests_open:
            guests = [await guests_open.enter_async_context(ChatClient(stack.base_url)) for _ in range(50)]
            # Every guest has its page and its ten conversations first: the burst is the posts.
            conversations = await asyncio.gather(*(guest_with_conversations(g) for g in guests))
            pairs = zip(guests, conversations, strict=True)
            return await asyncio.gather(*(posts_and_streams(g, c, n) for n, (g, c) in enumerate(pairs)))

    outcomes = asyncio.run(scenario())
    responses = [r for client_responses, _ in outcomes for r in client_responses]
    completed = [pair for _, pairs in outcomes for pair in pairs]
    assert len(responses) == 500
    assert {r.status_code for r in responses} <= {202, 429, 503}
    refusals = [r for r in responses if r.status_code != 202]
    assert all(int(r.headers["Retry-After"]) >= 1 for r in refusals)
    assert all(r.json()["error"]["message"] for r in refusals)
    assert len(completed) == sum(r.status_code == 202 for r in responses) > 0
    _assert_complete_and_stored_once(stack, completed)
