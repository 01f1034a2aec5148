"""The OpenAI-compatible API through the official `openai` client, against the real processes."""

from __future__ import annotations

import json
import logging
import time
import uuid

import jsonschema
import openai
import pytest
import redis

from scheduler import keys
from tests.e2e.conftest import running_stack
from tests.generation_jobs import MODEL

pytestmark = pytest.mark.e2e

logger = logging.getLogger(__name__)
QUESTION = [{"role": "user", "content": "Where is my parcel?"}]


@pytest.fixture(scope="module")
def stack():
    yield from running_stack(
        # Normal keys may send 3 calls at once, then one a second: a flood shows within a second.
        RATE_LIMIT_NORMAL_CAPACITY="3",
        RATE_LIMIT_NORMAL_REFILL_PER_S="1",
        API_DISCONNECT_GRACE_S="0",
        SIMULATED_OUTPUT_TOKENS="400",  # long enough to drop mid-answer; other calls ask for few
    )


@pytest.fixture(scope="module")
def vip_key(stack) -> str:
    return stack.create_api_key("victor")


def _client(stack, key: str, **options) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url + "/v1", api_key=key, max_retries=0, **options)


def test_models_list_names_the_variants_of_the_model_the_worker_serves(stack, vip_key):
    models = _client(stack, vip_key).models.list()
    assert [(m.id, m.owned_by) for m in models.data] == [("candidate", "simulated"), ("stable", "simulated")]


def test_a_completion_returns_the_answer_with_usage_and_finish_reason(stack, vip_key):
    completion = _client(stack, vip_key).chat.completions.create(
        model="stable", messages=QUESTION, max_tokens=12
    )
    [choice] = completion.choices
    assert choice.message.role == "assistant"
    assert choice.message.content.startswith("[simulated] You asked: Where is my parcel?")
    assert choice.finish_reason == "length"
    assert completion.model == "stable"
    assert completion.usage.completion_tokens == 12
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 12


def test_a_streamed_completion_yields_the_answer_in_chunks_then_usage(stack, vip_key):
    stream = _client(stack, vip_key).chat.completions.create(
        model="stable",
        messages=QUESTION,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("[simulated] You asked: Where is my parcel?")
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "length"
    ]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert len({c.id for c in chunks}) == 1


def test_a_wrong_or_revoked_key_raises_authentication_error(stack):
    with pytest.raises(openai.AuthenticationError) as wrong:
        _client(stack, "sk-" + "x" * 43).chat.completions.create(model="stable", messages=QUESTION)
    assert wrong.value.code == "invalid_api_key"
    key = stack.create_api_key("alice")
    assert _client(stack, key).models.list().data
    assert stack.manage("apikey", "revoke", key[:11]).returncode == 0
    with pytest.raises(openai.AuthenticationError):
        _client(stack, key).models.list()


def test_a_flood_raises_rate_limit_error_and_the_client_honours_retry_after(stack):
    key = stack.create_api_key("alice")  # normal tier: 3 at once, then one a second
    plain = _client(stack, key)
    with pytest.raises(openai.RateLimitError) as refused:
        for _ in range(10):
            plain.chat.completions.create(model="stable", messages=QUESTION, max_tokens=1)
    assert refused.value.code == "rate_limit_exceeded"
    assert int(refused.value.response.headers["retry-after"]) >= 1

    # With one retry allowed, the client waits as long as Retry-After says and then succeeds.
    statuses: list[int] = []
    http = openai.DefaultHttpxClient(event_hooks={"response": [lambda r: statuses.append(r.status_code)]})
    patient = _client(stack, key, http_client=http).with_options(max_retries=1)
    for _ in range(5):
        statuses.clear()
        started = time.monotonic()
        completion = patient.chat.completions.create(model="stable", messages=QUESTION, max_tokens=1)
        if statuses == [429, 200]:
            logger.info(
                "refused, then served after %.2f s (Retry-After honoured)", time.monotonic() - started
            )
            break
    assert statuses == [429, 200]
    assert completion.choices[0].message.content


def test_a_client_that_drops_a_stream_cancels_its_generation(stack, vip_key):
    stream = _client(stack, vip_key).chat.completions.create(
        model="stable", messages=QUESTION, max_tokens=400, stream=True
    )
    first = [next(stream) for _ in range(3)]
    stream.close()  # the connection goes; with a grace of 0 the worker stops the answer
    request_id = str(uuid.UUID(first[0].id.removeprefix("chatcmpl-")))
    results = redis.Redis.from_url(stack.redis.url, decode_responses=True)
    deadline = time.monotonic() + 15
    done = None
    while done is None and time.monotonic() < deadline:
        events = results.xrange(keys.result(MODEL, request_id))
        done = next((json.loads(f["data"]) for _, f in events if f["type"] == "done"), None)
        time.sleep(0.2)
    assert done is not None, "the generation did not end"
    assert done["finish_reason"] == "cancelled"
    assert done["usage"]["completion_tokens"] < 400


# --- vLLM's parameters, answered by the simulated engine --------------------------------------

ORDER_STATUS = {
    "type": "function",
    "function": {
        "name": "order_status",
        "description": "Look an order up.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}, "express": {"type": "boolean"}},
            "required": ["order_id", "express"],
        },
    },
}


def test_a_seed_gives_the_same_answer_and_n_gives_that_many_choices(stack, vip_key):
    client = _client(stack, vip_key)

    def ask(**options):
        return client.chat.completions.create(model="stable", messages=QUESTION, max_tokens=20, **options)

    assert ask(seed=5).choices[0].message.content == ask(seed=5).choices[0].message.content
    completion = ask(seed=5, n=3, temperature=1.0)
    contents = [choice.message.content for choice in completion.choices]
    assert [choice.index for choice in completion.choices] == [0, 1, 2]
    assert len(set(contents)) == 3, "three seeds, three answers"
    assert completion.usage.completion_tokens == 60


def test_min_tokens_ignore_eos_and_stop_shape_the_answer_s_length(stack, vip_key):
    client = _client(stack, vip_key)
    longer = client.chat.completions.create(
        model="stable", messages=QUESTION, max_tokens=420, extra_body={"ignore_eos": True}
    )
    # The simulated answer ends by itself at 400 tokens; ignore_eos runs on to max_tokens.
    assert (longer.usage.completion_tokens, longer.choices[0].finish_reason) == (420, "length")
    stopped = client.chat.completions.create(
        model="stable", messages=QUESTION, max_tokens=30, stop=["parcel"]
    )
    assert stopped.choices[0].message.content == "[simulated] You asked: Where is my "
    assert stopped.choices[0].finish_reason == "stop"


def test_a_json_schema_response_is_json_valid_against_the_schema(stack, vip_key):
    schema = ORDER_STATUS["function"]["parameters"]
    completion = _client(stack, vip_key).chat.completions.create(
        model="stable",
        messages=QUESTION,
        response_format={"type": "json_schema", "json_schema": {"name": "status", "schema": schema}},
    )
    answer = json.loads(completion.choices[0].message.content)
    jsonschema.validate(answer, schema)


def test_a_named_tool_choice_returns_a_tool_call_with_json_arguments(stack, vip_key):
    completion = _client(stack, vip_key).chat.completions.create(
        model="stable",
        messages=QUESTION,
        tools=[ORDER_STATUS],
        tool_choice={"type": "function", "function": {"name": "order_status"}},
    )
    [call] = completion.choices[0].message.tool_calls
    assert call.function.name == "order_status"
    jsonschema.validate(json.loads(call.function.arguments), ORDER_STATUS["function"]["parameters"])


def test_a_required_tool_choice_streams_its_calls_and_finishes_with_tool_calls(stack, vip_key):
    stream = _client(stack, vip_key).chat.completions.create(
        model="stable", messages=QUESTION, tools=[ORDER_STATUS], tool_choice="required", stream=True
    )
    chunks = list(stream)
    calls = [
        call
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
        for call in c.choices[0].delta.tool_calls
    ]
    assert [call.function.name for call in calls] == ["order_status"]
    assert json.loads(calls[0].function.arguments)["order_id"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_auto_tool_choice_is_refused_naming_the_parameter(stack, vip_key):
    with pytest.raises(openai.BadRequestError) as refused:
        _client(stack, vip_key).chat.completions.create(
            model="stable", messages=QUESTION, tools=[ORDER_STATUS]
        )
    assert refused.value.body["param"] == "tool_choice"


def test_logprobs_come_whole_and_streamed_in_openai_shape(stack, vip_key):
    client = _client(stack, vip_key)
    whole = client.chat.completions.create(
        model="stable", messages=QUESTION, max_tokens=6, logprobs=True, top_logprobs=2
    )
    content = whole.choices[0].logprobs.content
    assert "".join(entry.token for entry in content) == whole.choices[0].message.content
    assert all(entry.logprob <= 0 and len(entry.top_logprobs) == 2 for entry in content)
    stream = client.chat.completions.create(
        model="stable", messages=QUESTION, max_tokens=6, logprobs=True, stream=True
    )
    streamed = [
        entry
        for c in stream
        if c.choices and c.choices[0].logprobs
        for entry in c.choices[0].logprobs.content
    ]
    assert [entry.token for entry in streamed] == [entry.token for entry in content]
