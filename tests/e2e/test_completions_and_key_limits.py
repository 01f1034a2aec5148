"""/v1/completions and a key's own limits through the official `openai` client, against the real
processes: a raw prompt answered whole and streamed, limits set by staff in the console (audited),
the third call of a key with 2 requests a minute refused with OpenAI's headers, tokens counted as
the answer used them, and each key's usage in /metrics."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.keys import KEY_PREFIX, VISIBLE_CHARS
from tests.e2e.client import ChatClient
from tests.e2e.conftest import running_stack

pytestmark = pytest.mark.e2e

PROMPT = "Once upon a time in a parcel depot"
TOKENS_PER_MINUTE = 300


@pytest.fixture(scope="module")
def stack():
    yield from running_stack(SIMULATED_OUTPUT_TOKENS="20")


def _client(stack, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url + "/v1", api_key=key, max_retries=0)


def _prefix(key: str) -> str:
    return key[: len(KEY_PREFIX) + VISIBLE_CHARS]


def _limits_set(stack, key: str, *, requests: str = "", tokens: str = "") -> None:
    """As staff would in the console's API keys page."""
    [row] = stack.db_rows("SELECT id FROM chat_apikey WHERE prefix = %s", (_prefix(key),))
    key_id = row["id"]

    async def edit() -> None:
        async with ChatClient(stack.base_url) as staff:
            await staff.login("sam", stack.staff_password)
            await staff.http.get("/console/api-keys")
            response = await staff.http.post(
                f"/console/api-keys/{key_id}/limits",
                data={
                    "csrfmiddlewaretoken": staff.csrf,
                    f"key-{key_id}-requests_per_minute": requests,
                    f"key-{key_id}-tokens_per_minute": tokens,
                },
            )
            assert response.status_code == 200, response.text

    asyncio.run(edit())


def test_a_text_completion_continues_the_raw_prompt_whole_and_streamed(stack):
    client = _client(stack, stack.create_api_key("alice"))
    completion = client.completions.create(model="stable", prompt=PROMPT, max_tokens=12)
    [choice] = completion.choices
    assert completion.object == "text_completion"
    assert choice.text.startswith(f"[simulated] You asked: {PROMPT}")
    assert choice.finish_reason == "length"
    assert completion.usage.completion_tokens == 12

    chunks = list(
        client.completions.create(
            model="stable",
            prompt=[PROMPT],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(choice.text for chunk in chunks for choice in chunk.choices)
    assert text == choice.text  # the simulated engine is deterministic
    assert [c.finish_reason for chunk in chunks for c in chunk.choices][-1] == "length"
    assert chunks[-1].usage.total_tokens == completion.usage.total_tokens


def test_a_text_completion_takes_n_seeds_and_logprobs_as_vllm_s_completions_endpoint(stack):
    client = _client(stack, stack.create_api_key("alice"))
    completion = client.completions.create(
        model="stable", prompt=PROMPT, max_tokens=16, n=2, seed=3, logprobs=2, presence_penalty=0.5
    )
    first, second = completion.choices
    assert (first.index, second.index) == (0, 1)
    assert first.text != second.text  # choice 1 samples with seed 4
    for choice in (first, second):
        logprobs = choice.logprobs
        assert "".join(logprobs.tokens) == choice.text
        assert logprobs.text_offset[1] == len(logprobs.tokens[0])
        for token, top in zip(logprobs.tokens, logprobs.top_logprobs, strict=True):
            assert token in top and len(top) <= 3  # the sampled token and 2 more
    assert completion.usage.completion_tokens == 32


def test_a_key_with_2_requests_a_minute_gets_429_on_the_third_call_with_openai_headers(stack):
    key = stack.create_api_key("alice")
    _limits_set(stack, key, requests="2")
    [audit] = stack.db_rows(
        "SELECT actor_name, target FROM admin_console_auditlog WHERE action = 'api_key.limits'"
        " AND target = %s",
        (_prefix(key),),
    )
    assert audit == {"actor_name": "sam", "target": _prefix(key)}

    client = _client(stack, key)
    first = client.completions.with_raw_response.create(model="stable", prompt=PROMPT, max_tokens=4)
    second = client.chat.completions.with_raw_response.create(
        model="stable", messages=[{"role": "user", "content": PROMPT}], max_tokens=4
    )
    assert [r.headers["x-ratelimit-remaining-requests"] for r in (first, second)] == ["1", "0"]
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    with pytest.raises(openai.RateLimitError) as refused:
        client.completions.create(model="stable", prompt=PROMPT, max_tokens=4)
    assert refused.value.status_code == 429
    assert refused.value.code == "rate_limit_exceeded"
    headers = refused.value.response.headers
    assert 1 <= int(headers["retry-after"]) <= 31
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"].endswith("s")
    # Another key is not affected.
    assert (
        _client(stack, stack.create_api_key("alice"))
        .completions.create(model="stable", prompt=PROMPT, max_tokens=4)
        .choices
    )


def test_tokens_per_minute_count_the_tokens_the_answer_used_not_what_it_might_have(stack):
    key = stack.create_api_key("alice")
    _limits_set(stack, key, tokens=str(TOKENS_PER_MINUTE))
    client = _client(stack, key)
    # max_tokens 200 reserves over two thirds of the minute's tokens; the answer uses about 30.
    first = client.completions.with_raw_response.create(model="stable", prompt=PROMPT, max_tokens=200)
    answered = time.monotonic()
    after_admission = int(first.headers["x-ratelimit-remaining-tokens"])
    assert after_admission < TOKENS_PER_MINUTE - 200
    used = first.parse().usage.total_tokens
    assert used < 40
    now = client.models.with_raw_response.list()
    refilled = (time.monotonic() - answered + 1) * TOKENS_PER_MINUTE / 60
    remaining = int(now.headers["x-ratelimit-remaining-tokens"])
    assert TOKENS_PER_MINUTE - used - 1 <= remaining <= TOKENS_PER_MINUTE - used + refilled
    # Without the settlement the reservation would still hold, and this call would be refused.
    assert client.completions.create(model="stable", prompt=PROMPT, max_tokens=200).choices


def test_metrics_show_each_key_s_usage_today_by_prefix(stack):
    key = stack.create_api_key("alice")
    client = _client(stack, key)
    usages = [client.completions.create(model="stable", prompt=PROMPT, max_tokens=5).usage for _ in range(3)]
    response = httpx.get(f"{stack.base_url}/metrics", timeout=10)
    assert response.status_code == 200
    assert key not in response.text
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }
    prefix = _prefix(key)
    assert samples[("llm_api_key_requests_today", (("key", prefix),))] == 3
    assert samples[("llm_api_key_errors_today", (("key", prefix),))] == 0
    completion = samples[("llm_api_key_tokens_today", (("key", prefix), ("kind", "completion")))]
    assert completion == sum(usage.completion_tokens for usage in usages) == 15
