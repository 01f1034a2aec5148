"""The OpenAI-compatible API through Django's test client, with a test playing the worker."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client, override_settings

from accounts.models import User
from api import keys as api_keys
from api.models import ApiKey
from knowledge import cache as answer_cache
from knowledge import services as knowledge_services
from scheduler import keys, routing, workers
from scheduler.generation import GenerationJob, StructuredOutput, Tier, ToolParsing
from scheduler.models import CanaryRouting, Generation, TierPolicy, Variant
from scheduler.policy import policies_mirror
from scheduler.redis import new_async_redis, sync_redis
from scheduler.routing import canary_mirror
from tests import worker_double
from tests.generation_jobs import MODEL, ORDER_TOOL

pytestmark = pytest.mark.django_db

HELLO = {"model": "stable", "messages": [{"role": "user", "content": "Where is my order?"}]}


@pytest.fixture
def alice() -> User:
    return User.objects.create(username="alice")


@pytest.fixture
def key(alice) -> str:
    return api_keys.api_key_create(owner=alice, name="tests").plaintext


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _post(client: Client, key: str | None, body: Any, **extra) -> Any:
    headers = _auth(key) if key else {}
    data = body if isinstance(body, str) else json.dumps(body)
    return client.post(
        "/v1/chat/completions", data, content_type="application/json", headers=headers, **extra
    )


def _queued_anywhere() -> int:
    return sum(sync_redis().xlen(keys.queue(MODEL, tier)) for tier in keys.TIERS)


def _with_answer(key: str, body: dict, *events: tuple[str, dict]) -> Any:
    """POST a completion while the worker double answers it. Returns the response, the request
    as queued, and the streamed body read to its end (empty for a whole completion)."""

    async def scenario():
        client = AsyncClient()
        call = asyncio.create_task(
            client.post(
                "/v1/chat/completions", json.dumps(body), content_type="application/json", headers=_auth(key)
            )
        )
        [job] = await asyncio.to_thread(worker_double.wait_queued, "normal")
        await asyncio.to_thread(worker_double.publish, job["request_id"], *events)
        response = await call
        streamed = (
            b"".join([chunk async for chunk in response.streaming_content]) if response.streaming else b""
        )
        return response, job, streamed.decode()

    return async_to_sync(scenario)()


def _sse_data(text: str) -> list[Any]:
    datas = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    return [data if data == "[DONE]" else json.loads(data) for data in datas]


# --- authentication -------------------------------------------------------------------------


@pytest.mark.parametrize("header", [None, "Bearer", "Basic c2stYWJj", "Bearer sk-not-a-real-key", "Bearer x"])
def test_a_missing_or_wrong_key_gets_401_in_openai_shape_and_queues_nothing(header):
    headers = {"Authorization": header} if header else {}
    response = Client().post("/v1/chat/completions", HELLO, content_type="application/json", headers=headers)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert _queued_anywhere() == 0


def test_a_revoked_key_gets_401_at_once(alice):
    issued = api_keys.api_key_create(owner=alice)
    api_keys.api_key_revoke(api_key=issued.api_key)
    response = _post(Client(), issued.plaintext, HELLO)
    assert response.status_code == 401
    assert "revoked" in response.json()["error"]["message"]


def test_a_signed_in_session_is_not_an_api_key(alice):
    client = Client()
    client.force_login(alice)
    assert _post(client, None, HELLO).status_code == 401
    assert client.get("/v1/models").status_code == 401


def test_api_calls_need_no_csrf_token(key):
    assert _post(Client(enforce_csrf_checks=True), key, HELLO | {"stream": True}).status_code == 200


# --- models ---------------------------------------------------------------------------------


def _heartbeat(worker_id: str, model: str, *, draining: bool = False) -> None:
    async def write():
        client = new_async_redis()
        info = {"model": model, "engine": "simulated", "slots": 4, "running": 0, "draining": draining}
        await workers.heartbeat_write(
            client, worker_id=worker_id, info=info, jobs_per_s=1, normal_jobs_per_s=1
        )
        await client.aclose()

    asyncio.run(write())


def test_models_lists_the_variants_whose_model_has_a_live_worker_not_draining(key):
    for name, model in [("canary-b", "model-b"), ("leaving", "model-leaving"), ("idle", "model-idle")]:
        Variant.objects.create(
            name=name, model=model, system_prompt="-", temperature=0, top_p=1, max_tokens=8
        )
    Variant.objects.filter(name="candidate").update(model="model-idle")
    _heartbeat("w1", MODEL)
    _heartbeat("w2", "model-b")
    _heartbeat("w3", "model-leaving", draining=True)
    response = Client().get("/v1/models", headers=_auth(key))
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["canary-b", "stable"]
    assert body["data"][0] == {"id": "canary-b", "object": "model", "created": 0, "owned_by": "simulated"}
    assert Client().get("/v1/models/stable", headers=_auth(key)).json()["id"] == "stable"
    missing = Client().get("/v1/models/leaving", headers=_auth(key))
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "model_not_found")


# --- requests: what is accepted and what reaches the worker ------------------------------------


def test_the_worker_gets_the_generation_parameters_the_key_s_limits_and_the_api_grace(key, alice, settings):
    settings.API_DISCONNECT_GRACE_S = 0.0
    body = HELLO | {"max_tokens": 12, "temperature": 0.2, "top_p": 0.5, "stop": ["\n\n"], "stream": True}
    assert _post(Client(), key, body).status_code == 200
    [job] = worker_double.queued("normal")
    assert job["messages"] == HELLO["messages"]
    assert (job["max_tokens"], job["temperature"], job["top_p"], job["stop"]) == (12, 0.2, 0.5, ["\n\n"])
    assert job["disconnect_grace_s"] == 0.0
    assert job["client_id"] == f"key:{alice.api_keys.get().pk}"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/jobs"])
def test_a_model_no_variant_answers_is_a_404_as_vllm_serve_gives_it(key, path):
    body = {**HELLO, "model": "gpt-4o"}
    if path == "/v1/completions":
        body = {"model": "gpt-4o", "prompt": "Hello"}
    elif path == "/v1/jobs":
        body = {"requests": [{**HELLO, "model": "gpt-4o"}]}
    response = Client().post(path, json.dumps(body), content_type="application/json", headers=_auth(key))
    assert response.status_code == 404
    assert response.json()["error"] == {
        "message": "The model `gpt-4o` does not exist.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }
    assert _queued_anywhere() == 0


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_model_name_with_a_nul_character_is_a_404_on_either_database(key, path):
    """PostgreSQL refuses a NUL in a query: found by the schema fuzz as a 500."""
    chat = path == "/v1/chat/completions"
    body = {**HELLO, "model": "stable\x00"} if chat else {"model": "stable\x00", "prompt": "Hello"}
    response = Client().post(path, json.dumps(body), content_type="application/json", headers=_auth(key))
    assert (response.status_code, response.json()["error"]["code"]) == (404, 404)
    assert _queued_anywhere() == 0


def test_naming_the_stable_variant_takes_the_canary_s_routing_and_naming_another_gets_it(key):
    CanaryRouting.objects.update(candidate_variant="candidate", split_percent=0)
    canary_mirror()
    streamed = {**HELLO, "stream": True}  # answered as it comes: the call returns at once
    assert _post(Client(), key, streamed).status_code == 200
    assert _post(Client(), key, {**streamed, "model": "candidate"}).status_code == 200
    assert [job["variant"] for job in worker_double.queued("normal")] == ["stable", "candidate"]


def test_a_key_without_a_tier_follows_its_owner_and_a_key_with_one_overrides_it(alice):
    alice.tier = Tier.VIP
    alice.save()
    owners = api_keys.api_key_create(owner=alice).plaintext
    normal = api_keys.api_key_create(owner=alice, tier=Tier.NORMAL).plaintext
    for plaintext in (owners, normal):
        assert _post(Client(), plaintext, HELLO | {"stream": True}).status_code == 200
    assert len(worker_double.queued("vip")) == 1
    assert len(worker_double.queued("normal")) == 1


def test_text_content_parts_and_the_developer_role_are_accepted(key):
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]},
    ]
    assert _post(Client(), key, {"model": "stable", "messages": messages, "stream": True}).status_code == 200
    [job] = worker_double.queued("normal")
    assert job["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello\nthere"},
    ]


def test_vllm_s_sampling_parameters_reach_the_queued_job(key):
    body = HELLO | {
        "stream": True,
        "seed": 7,
        "presence_penalty": 0.5,
        "top_k": 5,
        "min_tokens": 2,
        "ignore_eos": True,
        "logprobs": True,
        "top_logprobs": 2,
        "response_format": {"type": "json_object"},
    }
    assert _post(Client(), key, body).status_code == 200
    [job] = worker_double.queued("normal")
    assert (job["seed"], job["presence_penalty"], job["top_k"], job["min_tokens"], job["ignore_eos"]) == (
        7,
        0.5,
        5,
        2,
        True,
    )
    assert job["logprobs"] == 2
    assert StructuredOutput.from_dict(job["structured"]) == StructuredOutput(json_object=True)


def test_n_choices_queue_one_generation_each(key):
    # No temperature named: vLLM's default (1) samples, so n > 1 is accepted as on `vllm serve`.
    body = HELLO | {"stream": True, "n": 3, "seed": 1}
    assert _post(Client(), key, body).status_code == 200
    jobs = worker_double.queued("normal")
    assert [job["seed"] for job in jobs] == [1, 2, 3]
    assert {job["temperature"] for job in jobs} == {1.0}
    assert len({job["request_id"] for job in jobs}) == 3


def test_n_choices_beyond_the_key_s_concurrency_are_refused_whole(key):
    TierPolicy.objects.filter(tier="normal").update(max_concurrent_per_user=2)
    policies_mirror()
    response = _post(Client(), key, HELLO | {"n": 3, "temperature": 0.7})
    assert response.status_code == 429
    # The choices admitted before the refusal are cancelled, not left to run for nobody.
    jobs = worker_double.queued("normal")
    assert len(jobs) == 2
    assert all(sync_redis().exists(keys.cancel(job["request_id"])) for job in jobs)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "lookup"}}]}, "tool_choice"),
        ({"presence_penalty": 5}, "presence_penalty"),
        ({"n": 2, "temperature": 0}, "n"),
    ],
)
def test_parameters_vllm_refuses_get_400_naming_the_parameter(key, extra, param):
    response = _post(Client(), key, HELLO | extra)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert _queued_anywhere() == 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ("{not json", None),
        ([1, 2], None),
        ({"messages": HELLO["messages"]}, "model"),
        ({"model": "stable"}, "messages"),
        ({"model": "stable", "messages": []}, "messages"),
        (HELLO | {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        (
            HELLO | {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content",
        ),
        (HELLO | {"max_tokens": 0}, "max_tokens"),
        (HELLO | {"max_completion_tokens": 10**9}, "max_completion_tokens"),
        (HELLO | {"temperature": 3}, "temperature"),
        (HELLO | {"top_p": 0}, "top_p"),
        (HELLO | {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        (HELLO | {"stream": "maybe"}, "stream"),
        (HELLO | {"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_malformed_requests_get_400_in_openai_shape(key, body, param):
    response = _post(Client(), key, body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert response.json()["error"]["message"]
    assert _queued_anywhere() == 0


def test_a_wrong_method_gets_405_in_openai_shape(key):
    response = Client().get("/v1/chat/completions", headers=_auth(key))
    assert (response.status_code, response["Allow"]) == (405, "POST")
    assert response.json()["error"]["message"]


# --- refusals -------------------------------------------------------------------------------


def test_a_flood_from_one_key_gets_429_with_retry_after_and_other_keys_are_unaffected(key, alice):
    TierPolicy.objects.filter(tier="normal").update(max_concurrent_per_user=100)
    policies_mirror()
    statuses = [_post(Client(), key, HELLO | {"stream": True}).status_code for _ in range(6)]
    refused = _post(Client(), key, HELLO)
    # The normal tier's bucket holds 6 per client and refills one every 5 s.
    assert statuses == [200] * 6
    assert refused.status_code == 429
    assert refused["Retry-After"] == "5"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    other = api_keys.api_key_create(owner=alice).plaintext
    assert _post(Client(), other, HELLO | {"stream": True}).status_code == 200


def test_a_full_queue_gets_503_with_retry_after(key):
    TierPolicy.objects.filter(tier="normal").update(max_queued=1)
    policies_mirror()
    assert _post(Client(), key, HELLO | {"stream": True}).status_code == 200
    response = _post(Client(), key, HELLO)
    assert response.status_code == 503
    assert int(response["Retry-After"]) >= 1
    assert response.json()["error"] == {
        "message": response.json()["error"]["message"],
        "type": "server_error",
        "param": None,
        "code": "queue_full",
    }


def test_redis_unreachable_gets_503_with_retry_after(key):
    sync_redis.cache_clear()
    try:
        with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
            response = _post(Client(), key, HELLO)
    finally:
        sync_redis.cache_clear()
    assert response.status_code == 503
    assert int(response["Retry-After"]) >= 1
    assert response.json()["error"]["code"] == "scheduler_unavailable"


# --- answers --------------------------------------------------------------------------------


def test_a_whole_completion_has_the_text_usage_and_finish_reason(key):
    response, job, _ = _with_answer(
        key,
        HELLO,
        ("start", {}),
        *worker_double.tokens("Lost ", "words "),
        # A worker died: the answer restarts, and only the new attempt counts.
        ("reset", {"reason": "worker_restarted", "attempt": 2}),
        *worker_double.tokens("Your ", "order ", "shipped."),
        worker_double.done("length", prompt_tokens=11, completion_tokens=3),
    )
    assert response.status_code == 200
    body = response.json()
    assert body["id"] == "chatcmpl-" + uuid.UUID(job["request_id"]).hex
    assert body["object"] == "chat.completion"
    assert body["model"] == "stable"
    [choice] = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": "Your order shipped.", "refusal": None}
    assert choice["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}


@pytest.mark.parametrize(
    ("code", "status", "retry_after", "should_retry"),
    [("expired", 503, "10", None), ("engine_error", 500, None, "false"), ("timeout", 500, None, "false")],
)
def test_an_answer_that_fails_is_an_error_in_openai_shape(key, code, status, retry_after, should_retry):
    response, _, _ = _with_answer(key, HELLO, ("error", {"code": code, "message": "It went wrong."}))
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    assert response.get("Retry-After") == retry_after
    assert response.get("x-should-retry") == should_retry


def test_a_streamed_completion_sends_chunks_then_usage_then_done(key):
    body = HELLO | {"stream": True, "stream_options": {"include_usage": True}}
    response, job, streamed = _with_answer(
        key,
        body,
        ("queued", {"seq": 1, "tier": "normal"}),
        ("reset", {"reason": "worker_restarted", "attempt": 2}),  # before any text: carried on
        ("start", {}),
        *worker_double.tokens("Your ", "order ", "shipped."),
        worker_double.done("stop", prompt_tokens=11, completion_tokens=3),
    )
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-cache"
    chunks = _sse_data(streamed)
    assert chunks[-1] == "[DONE]"
    *content, closing, usage, _ = chunks
    assert {c["id"] for c in chunks[:-1]} == {"chatcmpl-" + uuid.UUID(job["request_id"]).hex}
    assert {c["object"] for c in chunks[:-1]} == {"chat.completion.chunk"}
    assert content[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"]["content"] for c in content) == "Your order shipped."
    assert all(c["usage"] is None for c in content)
    assert closing["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}


def test_a_stream_s_first_chunk_comes_with_the_first_token_keep_alives_before_it(key, settings):
    # As vllm serve: a client timing the first chunk times the first token, not the admission.
    settings.SSE_HEARTBEAT_S = 0.05

    async def scenario():
        response = await AsyncClient().post(
            "/v1/chat/completions",
            json.dumps(HELLO | {"stream": True}),
            content_type="application/json",
            headers=_auth(key),
        )
        [job] = await asyncio.to_thread(worker_double.wait_queued, "normal")
        body = aiter(response.streaming_content)
        waiting = [await anext(body), await anext(body)]
        await asyncio.to_thread(worker_double.publish, job["request_id"], *worker_double.tokens("Hi"))
        first = [await anext(body), await anext(body)]
        await asyncio.to_thread(worker_double.publish, job["request_id"], worker_double.done())
        return waiting, first, [chunk async for chunk in body]

    waiting, first, _ = async_to_sync(scenario)()
    assert waiting == [b": keep-alive\n\n"] * 2
    role, text = _sse_data(b"".join(first).decode())
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert text["choices"][0]["delta"] == {"content": "Hi"}


def test_a_stream_without_include_usage_has_no_usage_field(key):
    _, _, streamed = _with_answer(
        key, HELLO | {"stream": True}, *worker_double.tokens("Hi"), worker_double.done()
    )
    chunks = _sse_data(streamed)
    assert chunks[-1] == "[DONE]"
    assert all("usage" not in c for c in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"


def test_a_reset_before_any_text_went_out_is_carried_on_with_the_new_attempt(key):
    # Tokens and the reset arrive together: the first attempt's text was never sent.
    _, _, streamed = _with_answer(
        key,
        HELLO | {"stream": True},
        *worker_double.tokens("Lost ", "words "),
        ("reset", {"reason": "worker_restarted", "attempt": 2}),
        *worker_double.tokens("Your ", "order ", "shipped."),
        worker_double.done(),
    )
    chunks = _sse_data(streamed)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
    assert (text, chunks[-2]["choices"][0]["finish_reason"], chunks[-1]) == (
        "Your order shipped.",
        "stop",
        "[DONE]",
    )


def test_a_stream_that_sent_text_ends_with_an_error_chunk_on_reset_and_cancels_the_restart(key):
    async def scenario():
        response = await AsyncClient().post(
            "/v1/chat/completions",
            json.dumps(HELLO | {"stream": True}),
            content_type="application/json",
            headers=_auth(key),
        )
        [job] = await asyncio.to_thread(worker_double.wait_queued, "normal")
        body = aiter(response.streaming_content)
        await asyncio.to_thread(
            worker_double.publish, job["request_id"], *worker_double.tokens("Your ", "order ")
        )
        chunks = [await anext(body), await anext(body)]  # the role chunk, then the text went out
        await asyncio.to_thread(
            worker_double.publish,
            job["request_id"],
            ("reset", {"reason": "worker_restarted", "attempt": 2}),
            *worker_double.tokens("Your ", "order ", "shipped."),
            worker_double.done(),
        )
        chunks += [chunk async for chunk in body]
        return job, b"".join(chunks).decode()

    job, streamed = async_to_sync(scenario)()
    chunks = _sse_data(streamed)
    assert chunks[-1] == "[DONE]"
    assert chunks[-2]["error"]["code"] == "generation_restarted"
    # Nothing of the second attempt follows the first's text: nothing is said twice.
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if "choices" in c)
    assert text in {"Your ", "Your order "}
    assert sync_redis().exists(keys.cancel(job["request_id"]))


def test_a_stream_whose_answer_fails_ends_with_an_error_chunk_and_done(key):
    _, _, streamed = _with_answer(
        key,
        HELLO | {"stream": True},
        *worker_double.tokens("Your "),
        ("error", {"code": "timeout", "message": "Too slow."}),
    )
    chunks = _sse_data(streamed)
    assert chunks[-2] == {
        "error": {"message": "Too slow.", "type": "server_error", "param": None, "code": "timeout"}
    }
    assert chunks[-1] == "[DONE]"


# --- choices, logprobs and tool calls ----------------------------------------------------------


def _with_answers(key: str, body: dict, *answers: list[tuple[str, dict]]) -> tuple[Any, str]:
    """POST a completion of len(answers) choices while the worker double answers each."""
    response, _, streamed = worker_double.post_answered("/v1/chat/completions", body, _auth(key), *answers)
    return response, streamed


def _logprob_token(seq: int, text: str, logprob: float) -> tuple[str, dict]:
    entry = {"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []}
    return ("token", {"seq": seq, "text": text, "logprobs": [entry]})


def test_n_choices_come_back_whole_with_usage_counting_the_prompt_once(key):
    response, _ = _with_answers(
        key,
        HELLO | {"n": 2, "temperature": 1},
        [*worker_double.tokens("First."), worker_double.done("stop", prompt_tokens=9, completion_tokens=2)],
        [
            *worker_double.tokens("Second", " one."),
            worker_double.done("length", prompt_tokens=9, completion_tokens=4),
        ],
    )
    body = response.json()
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "First.", "stop"),
        (1, "Second one.", "length"),
    ]
    assert body["usage"] == {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15}


def test_one_failed_choice_fails_the_call_and_cancels_the_others(key):
    response, _ = _with_answers(
        key,
        HELLO | {"n": 2, "temperature": 1},
        [("error", {"code": "engine_error", "message": "Broke."})],
        [*worker_double.tokens("Still writing")],
    )
    assert (response.status_code, response.json()["error"]["code"]) == (500, "engine_error")
    assert all(sync_redis().exists(keys.cancel(job["request_id"])) for job in worker_double.queued("normal"))


def test_streamed_choices_carry_their_index_and_logprobs(key):
    _, streamed = _with_answers(
        key,
        HELLO | {"n": 2, "temperature": 1, "stream": True, "logprobs": True},
        [_logprob_token(0, "A", -0.5), worker_double.done()],
        [_logprob_token(0, "B", -1.5), worker_double.done()],
    )
    chunks = _sse_data(streamed)[:-1]
    content = [c["choices"][0] for c in chunks if c["choices"][0]["delta"].get("content")]
    assert sorted(
        (c["index"], c["delta"]["content"], c["logprobs"]["content"][0]["logprob"]) for c in content
    ) == [
        (0, "A", -0.5),
        (1, "B", -1.5),
    ]
    closing = [c["choices"][0] for c in chunks if c["choices"][0]["finish_reason"]]
    assert sorted(c["index"] for c in closing) == [0, 1]


def test_a_streamed_named_tool_call_sends_its_arguments_as_tool_call_deltas(key):
    tool = {"type": "function", "function": {"name": "order_status", "parameters": {"type": "object"}}}
    body = HELLO | {
        "stream": True,
        "tools": [tool],
        "tool_choice": {"type": "function", "function": {"name": "order_status"}},
    }
    _, streamed = _with_answers(
        key, body, [*worker_double.tokens('{"order', '_id": 1}'), worker_double.done()]
    )
    chunks = _sse_data(streamed)[:-1]
    calls = [
        c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if "tool_calls" in c["choices"][0]["delta"]
    ]
    assert calls[0]["id"].startswith("chatcmpl-tool-")
    assert (calls[0]["type"], calls[0]["function"]["name"]) == ("function", "order_status")
    # However the tokens were batched, only the first delta names the call.
    assert all("id" not in call and call["index"] == 0 for call in calls[1:])
    assert "".join(call["function"]["arguments"] for call in calls) == '{"order_id": 1}'
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.fixture
def pythonic_stable():
    """The stable variant's model writes tool calls that vLLM's `pythonic` parser reads."""
    Variant.objects.filter(name="stable").update(tool_call_parser="pythonic")
    routing.variants_forget()


def test_tools_without_a_tool_call_parser_are_vllm_s_400_and_queue_nothing(key):
    response = _post(Client(), key, HELLO | {"tools": [ORDER_TOOL]})  # no tool_choice: "auto"
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "tool_choice"
    assert "--tool-call-parser" in response.json()["error"]["message"]
    assert _queued_anywhere() == 0


def test_auto_tool_choice_asks_the_worker_to_read_calls_with_the_variant_s_parser(key, pythonic_stable):
    assert _post(Client(), key, HELLO | {"stream": True, "tools": [ORDER_TOOL]}).status_code == 200
    [job] = [
        GenerationJob.decode(fields["job"]) for _, fields in sync_redis().xrange(keys.queue(MODEL, "normal"))
    ]
    assert job.tool_parsing == ToolParsing(parser="pythonic", tools=[ORDER_TOOL], parallel_tool_calls=True)


def _parsed_call_answer() -> list[tuple[str, dict]]:
    """An answer the worker's parser read as one call (in two pieces), as the worker writes it."""
    first = {"index": 0, "id": "chatcmpl-tool-1", "name": "order_status", "arguments": '{"id": '}
    rest = {"index": 0, "id": None, "name": None, "arguments": '"12345"}'}
    whole = {"content": None, "tool_calls": [{"name": "order_status", "arguments": '{"id": "12345"}'}]}
    return [
        ("token", {"seq": 0, "text": "[order_status(", "parsed": {"content": None, "tool_calls": []}}),
        ("token", {"seq": 1, "text": 'id="12345"', "parsed": {"content": None, "tool_calls": [first]}}),
        ("token", {"seq": 2, "text": ")]", "parsed": {"content": None, "tool_calls": [rest]}}),
        (
            "done",
            {"finish_reason": "stop", "usage": {"prompt_tokens": 9, "completion_tokens": 3}, "parsed": whole},
        ),
    ]


def test_an_auto_answer_that_calls_a_tool_comes_back_as_tool_calls(key, pythonic_stable):
    response, _ = _with_answers(key, HELLO | {"tools": [ORDER_TOOL]}, _parsed_call_answer())
    [choice] = response.json()["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert (call["function"]["name"], call["function"]["arguments"]) == ("order_status", '{"id": "12345"}')


def test_a_streamed_auto_answer_sends_the_parser_s_pieces_and_finishes_with_tool_calls(key, pythonic_stable):
    _, streamed = _with_answers(key, HELLO | {"stream": True, "tools": [ORDER_TOOL]}, _parsed_call_answer())
    chunks = _sse_data(streamed)[:-1]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(delta.get("content") or "" for delta in deltas) == ""  # the call's text is not content
    pieces = [piece for delta in deltas for piece in delta.get("tool_calls") or ()]
    assert pieces[0] == {
        "index": 0,
        "id": "chatcmpl-tool-1",
        "type": "function",
        "function": {"name": "order_status", "arguments": '{"id": '},
    }
    assert pieces[1] == {"index": 0, "function": {"arguments": '"12345"}'}}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def _parsed_text_answer() -> list[tuple[str, dict]]:
    words = [
        ("token", {"seq": n, "text": t, "parsed": {"content": t, "tool_calls": []}})
        for n, t in enumerate(["It ", "shipped."])
    ]
    whole = {"content": "It shipped.", "tool_calls": []}
    usage = {"prompt_tokens": 9, "completion_tokens": 2}
    return [*words, ("done", {"finish_reason": "stop", "usage": usage, "parsed": whole})]


def test_an_auto_answer_in_plain_text_is_content(key, pythonic_stable):
    response, _ = _with_answers(key, HELLO | {"tools": [ORDER_TOOL]}, _parsed_text_answer())
    [choice] = response.json()["choices"]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("It shipped.", "stop")
    assert "tool_calls" not in choice["message"]


def test_a_streamed_auto_answer_in_plain_text_is_content(key, pythonic_stable):
    _, streamed = _with_answers(key, HELLO | {"stream": True, "tools": [ORDER_TOOL]}, _parsed_text_answer())
    chunks = _sse_data(streamed)[:-1]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "It shipped."
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_call_of_several_choices_is_never_answered_from_the_result_cache(key):
    answer_cache._index.forget()
    body = HELLO | {"stream": True, "temperature": 0.7, "seed": 7}
    assert _post(Client(), key, body).status_code == 200
    [first] = worker_double.queued("normal")
    worker_double.answer(first["request_id"], "It left our warehouse today.")

    # The same one-choice call again is answered from the cache, without the queue...
    assert _post(Client(), key, body).status_code == 200
    assert len(worker_double.queued("normal")) == 1
    assert Generation.objects.filter(cache="exact").count() == 1
    # ...but n choices are n answers the model writes: every one is queued.
    assert _post(Client(), key, body | {"n": 2}).status_code == 200
    assert len(worker_double.queued("normal")) == 3
    answer_cache._index.forget()


def _api_cache_results() -> list[str]:
    """How the result cache took each API call, in order."""
    return list(Generation.objects.filter(origin="api").order_by("id").values_list("cache", flat=True))


def test_a_call_sampled_without_a_seed_is_never_answered_from_the_result_cache(key):
    """Its answer is a fresh sample each time on vllm serve; greedy and seeded ones are not."""
    answer_cache._index.forget()
    TierPolicy.objects.filter(tier="normal").update(max_concurrent_per_user=10)  # four calls at once
    policies_mirror()
    for body in (HELLO | {"stream": True, "temperature": 0.7}, HELLO | {"stream": True, "temperature": 0}):
        for _ in range(2):
            answered = {job["request_id"] for job in worker_double.queued("normal")}
            assert _post(Client(), key, body).status_code == 200
            for job in worker_double.queued("normal"):
                if job["request_id"] not in answered:
                    worker_double.answer(job["request_id"], "It left our warehouse today.")
    assert _api_cache_results() == [
        "",
        "",
        "miss",
        "exact",
    ]
    answer_cache._index.forget()


def test_a_call_is_answered_from_the_result_cache_only_for_the_very_same_text(key):
    """Another spelling is another prompt to the model: vllm serve could answer it otherwise."""
    answer_cache._index.forget()
    body = HELLO | {"stream": True, "temperature": 0}
    assert _post(Client(), key, body).status_code == 200
    [first] = worker_double.queued("normal")
    worker_double.answer(first["request_id"], "It left our warehouse today.")

    respelled = body | {"messages": [{"role": "user", "content": "where is my order"}]}
    assert _post(Client(), key, respelled).status_code == 200
    assert _post(Client(), key, body).status_code == 200
    assert _api_cache_results() == [
        "miss",
        "miss",
        "exact",
    ]
    answer_cache._index.forget()


def test_a_cached_answer_survives_article_edits_the_api_never_reads(key):
    """A /v1 prompt is the caller's messages: no help-center change can make its answer stale."""
    answer_cache._index.forget()
    body = HELLO | {"stream": True, "temperature": 0}
    assert _post(Client(), key, body).status_code == 200
    [first] = worker_double.queued("normal")
    worker_double.answer(first["request_id"], "It left our warehouse today.")

    knowledge_services.article_create(
        slug="order-tracking", title="Tracking an order", body="Follow your order from your shipping email."
    )

    assert _post(Client(), key, body).status_code == 200
    assert Generation.objects.filter(cache="exact").count() == 1
    answer_cache._index.forget()


def test_an_answer_from_the_result_cache_still_counts_against_the_key_s_limits(key):
    answer_cache._index.forget()
    ApiKey.objects.update(requests_per_minute=2)
    body = HELLO | {"stream": True, "temperature": 0}
    assert _post(Client(), key, body).status_code == 200
    [first] = worker_double.queued("normal")
    worker_double.answer(first["request_id"], "It left our warehouse today.")

    cached = _post(Client(), key, body)
    assert cached.status_code == 200
    assert Generation.objects.filter(cache="exact").count() == 1
    assert cached["x-ratelimit-remaining-requests"] == "0"
    refused = _post(Client(), key, body)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert Generation.objects.filter(cache="exact").count() == 1
    answer_cache._index.forget()


def test_a_call_s_fair_share_source_is_its_key_whatever_it_sends(key, alice):
    api_key = ApiKey.objects.get(owner=alice)
    body = HELLO | {"stream": True, "user": "chat:guest:someone", "source": "chat:guest:someone"}
    response = _post(Client(), key, body, HTTP_X_SOURCE="chat:guest:someone")
    assert response.status_code == 200
    [(_, fields)] = sync_redis().xrange(keys.queue(MODEL, "normal"))
    assert fields["source"] == f"api:key:{api_key.pk}"
    assert float(fields["weight"]) == 1.0


def test_a_key_s_weight_set_by_staff_goes_with_its_calls(key, alice):
    ApiKey.objects.filter(owner=alice).update(fair_share_weight=3.0)
    assert _post(Client(), key, HELLO | {"stream": True}).status_code == 200
    [(_, fields)] = sync_redis().xrange(keys.queue(MODEL, "normal"))
    assert float(fields["weight"]) == 3.0
