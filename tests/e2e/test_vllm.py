"""Real vLLM with SmolLM2 behind the whole stack: HTTP in, SSE out, answers stored."""

import asyncio
import json
import signal
import time

import jsonschema
import openai
import psutil
import pytest
import redis

from bench.stack import QUESTIONS
from tests.e2e.client import ChatClient
from tests.e2e.conftest import LONG_ANSWER_MAX_TOKENS, LONG_ANSWER_QUESTION, running_stack

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

# The first is cancelled after two tokens: it asks for an answer long enough to still be running
# then (a brief one, such as "I don't know." to a question the help center cannot answer, can
# end before the cancel arrives). It is asked last, once the others are decoding, and followed
# at once: asked first, its whole answer could be written while the others are still being
# posted on a busy machine, before anyone watched it.
ASKED = [LONG_ANSWER_QUESTION, *QUESTIONS[1:]]


@pytest.fixture(scope="module")
def stack():
    yield from running_stack(
        INFERENCE_ENGINE="vllm",
        INFERENCE_MAX_NUM_SEQS="8",
        VIP_RESERVED_SLOTS="0",
        GENERATION_MAX_TOKENS=LONG_ANSWER_MAX_TOKENS,
        GENERATION_TEMPERATURE="0",
    )


def _heartbeat(stack) -> dict:
    client = redis.Redis.from_url(stack.redis.url, decode_responses=True)
    [key] = list(client.scan_iter("llm:worker:*"))
    return json.loads(client.get(key))


async def _heartbeat_after(stack, moment: float) -> dict:
    """The worker's first heartbeat written after `moment` (one read earlier may predate what
    the test just saw happen)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        beat = _heartbeat(stack)
        if beat["last_seen"] > moment:
            return beat
        await asyncio.sleep(0.05)
    raise AssertionError("the worker wrote no heartbeat for 30 s")


def test_eight_concurrent_questions_stream_real_answers_and_a_cancelled_one_is_aborted(stack):
    async def scenario():
        async with ChatClient(stack.base_url, timeout_s=300) as guest:
            await guest.open_page()
            conversations = [await guest.new_conversation() for _ in ASKED]
            others = [await guest.ask(c, q) for c, q in zip(conversations[1:], ASKED[1:], strict=True)]
            streams = [asyncio.create_task(guest.stream(r)) for r in others]
            request_ids = [await guest.ask(conversations[0], ASKED[0]), *others]
            first = await guest.stream(request_ids[0], stop_after_tokens=2)
            running_before = (await _heartbeat_after(stack, time.time()))["engine_running"]
            await guest.cancel(request_ids[0])
            # The abort reaches the engine: its running count drops while the others decode.
            running_after = running_before
            deadline = time.monotonic() + 30
            while running_after >= running_before and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                running_after = _heartbeat(stack)["engine_running"]
            cancelled = await guest.stream(request_ids[0], last_event_id=first.last_id)
            return (
                request_ids,
                first,
                cancelled,
                running_before,
                running_after,
                await asyncio.gather(*streams),
            )

    request_ids, first, cancelled, before, after, results = asyncio.run(scenario())
    assert cancelled.terminal.data["finish_reason"] == "cancelled"
    assert after < before, f"engine running count stayed at {before} after the cancel"
    for request_id, result in zip(request_ids[1:], results, strict=True):
        assert result.terminal.event == "done"
        assert result.terminal.data["timings"]["engine"] == "vllm"
        assert result.text.strip(), "an empty answer"
        assert "[simulated]" not in result.text
        assert stack.count_assistant_messages(request_id) == [("done", result.text)]
    [(status, content)] = stack.count_assistant_messages(request_ids[0])
    assert status == "cancelled"
    assert content == first.text + cancelled.text


def _openai(stack) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=stack.base_url + "/v1", api_key=stack.create_api_key("victor"), max_retries=0
    )


ORDER_STATUS = {
    "type": "function",
    "function": {
        "name": "order_status",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string", "maxLength": 16}},
            "required": ["order_id"],
            "additionalProperties": False,
        },
    },
}


def test_vllm_s_parameters_through_the_api_seed_logprobs_json_schema_and_a_named_tool(stack):
    client = _openai(stack)
    question = [{"role": "user", "content": "My order A-17 has not arrived. Where is it?"}]

    def sampled(**options):
        return client.chat.completions.create(
            model="stable", messages=question, max_tokens=16, temperature=1.0, **options
        )

    seeded = sampled(seed=1234, logprobs=True, top_logprobs=2)
    assert seeded.choices[0].message.content == sampled(seed=1234).choices[0].message.content
    entries = seeded.choices[0].logprobs.content
    assert len(entries) == seeded.usage.completion_tokens
    assert all(entry.logprob <= 0 and len(entry.top_logprobs) == 2 for entry in entries)

    schema = ORDER_STATUS["function"]["parameters"]
    shaped = client.chat.completions.create(
        model="stable",
        messages=question,
        max_tokens=48,
        response_format={"type": "json_schema", "json_schema": {"name": "status", "schema": schema}},
    )
    jsonschema.validate(json.loads(shaped.choices[0].message.content), schema)

    called = client.chat.completions.create(
        model="stable",
        messages=question,
        max_tokens=48,
        tools=[ORDER_STATUS],
        tool_choice={"type": "function", "function": {"name": "order_status"}},
    )
    [call] = called.choices[0].message.tool_calls
    assert call.function.name == "order_status"
    jsonschema.validate(json.loads(call.function.arguments), schema)


# Last in the module: it kills the engine the tests above share; a simulated worker takes over.
def test_a_dead_engine_stops_the_worker_with_an_error_and_hands_its_jobs_back(stack):
    async def scenario():
        async with ChatClient(stack.base_url, timeout_s=300) as guest:
            conversation = await guest.open_page()
            request_id = await guest.ask(conversation, LONG_ANSWER_QUESTION)
            await guest.stream(request_id, stop_after_tokens=1)
            [worker] = stack.workers
            engine_cores = psutil.Process(worker.pid).children(recursive=True)
            for process in engine_cores:
                process.send_signal(signal.SIGKILL)
            started = time.monotonic()
            returncode = await asyncio.to_thread(worker.wait, 60)
            exit_s = time.monotonic() - started
            stack.workers.remove(worker)
            # Another worker (the simulated one starts in seconds) takes the job over.
            await asyncio.to_thread(stack.start_worker, INFERENCE_ENGINE="simulated")
            result = await guest.stream(request_id)
            return request_id, returncode, exit_s, result

    request_id, returncode, exit_s, result = asyncio.run(scenario())
    print(f"worker exited {exit_s:.1f} s after its engine died")
    assert returncode != 0
    assert result.terminal.event == "done"
    assert result.of("reset"), "the stream was not told that the answer restarted"
    assert stack.count_assistant_messages(request_id) == [("done", result.text)]
