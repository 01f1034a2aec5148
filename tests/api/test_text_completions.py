"""The legacy /v1/completions through Django's test client, with a test playing the worker: a
raw prompt queued as it is (no chat template), answered in OpenAI's text_completion shape."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client

from api import keys as api_keys
from chat.models import User
from scheduler import keys
from scheduler.redis import sync_redis
from tests import worker_double

pytestmark = pytest.mark.django_db

PROMPT = "The three primary colours are"


@pytest.fixture
def key() -> str:
    return api_keys.api_key_create(owner=User.objects.create(username="alice")).plaintext


def _headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _post(key: str, body: Any) -> Any:
    return Client().post(
        "/v1/completions", json.dumps(body), content_type="application/json", headers=_headers(key)
    )


def _queued_anywhere() -> int:
    return sum(sync_redis().xlen(keys.queue("stable", tier)) for tier in keys.TIERS)


def _with_answer(key: str, body: dict, *events: tuple[str, dict]) -> tuple[Any, dict, str]:
    async def scenario():
        call = asyncio.create_task(
            AsyncClient().post(
                "/v1/completions", json.dumps(body), content_type="application/json", headers=_headers(key)
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


def test_a_raw_prompt_is_queued_as_it_is_and_answered_as_a_text_completion(key):
    response, job, _ = _with_answer(
        key,
        {"model": "stable", "prompt": PROMPT, "max_tokens": 5, "temperature": 0, "stop": "."},
        *worker_double.tokens(" red,", " yellow"),
        worker_double.done("length", prompt_tokens=6, completion_tokens=5),
    )
    assert (job["prompt"], job["messages"]) == (PROMPT, [])
    assert (job["max_tokens"], job["temperature"], job["stop"]) == (5, 0.0, ["."])
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "text_completion"
    assert body["id"].startswith("cmpl-")
    assert body["choices"] == [
        {"index": 0, "text": " red, yellow", "logprobs": None, "finish_reason": "length"}
    ]
    assert body["usage"] == {"prompt_tokens": 6, "completion_tokens": 5, "total_tokens": 11}


def test_a_prompt_in_a_list_of_one_is_accepted_and_max_tokens_defaults_to_16_as_openai(key):
    _, job, _ = _with_answer(key, {"model": "stable", "prompt": [PROMPT]}, worker_double.done())
    assert (job["prompt"], job["max_tokens"]) == (PROMPT, 16)


def test_a_streamed_text_completion_sends_text_chunks_then_usage_then_done(key):
    response, _, streamed = _with_answer(
        key,
        {"model": "stable", "prompt": PROMPT, "stream": True, "stream_options": {"include_usage": True}},
        *worker_double.tokens(" red,", " yellow"),
        worker_double.done("stop", prompt_tokens=6, completion_tokens=2),
    )
    assert response["Content-Type"] == "text/event-stream"
    *chunks, usage, done = _sse_data(streamed)
    assert done == "[DONE]"
    assert {chunk["object"] for chunk in [*chunks, usage]} == {"text_completion"}
    assert "".join(chunk["choices"][0]["text"] for chunk in chunks) == " red, yellow"
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks][-1] == "stop"
    assert all(chunk["usage"] is None for chunk in chunks)
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 6, "completion_tokens": 2, "total_tokens": 8}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"prompt": [PROMPT, "Two prompts"]}, "prompt"),
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"prompt": [[1, 2], [3]]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": None}, "prompt"),
        ({"echo": True}, "echo"),
        ({"suffix": "!"}, "suffix"),
        ({"best_of": 2}, "best_of"),
        ({"logprobs": 1}, "logprobs"),
        ({"n": 2}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_what_cannot_be_honoured_gets_400_naming_the_parameter_and_queues_nothing(key, extra, param):
    response = _post(key, {"model": "stable", "prompt": PROMPT, **extra})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert _queued_anywhere() == 0


def test_a_prompt_longer_than_the_context_is_refused_before_it_is_queued(key, settings):
    settings.INFERENCE_MAX_MODEL_LEN = 64
    response = _post(key, {"model": "stable", "prompt": "word " * 100, "max_tokens": 8})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert _queued_anywhere() == 0
