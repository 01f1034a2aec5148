"""The legacy /v1/completions through Django's test client, with a test playing the worker: a
raw prompt queued as it is (no chat template), answered in OpenAI's text_completion shape."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from accounts.models import User
from api import keys as api_keys
from scheduler import keys
from scheduler.generation import StructuredOutput
from scheduler.redis import sync_redis
from tests import worker_double
from tests.generation_jobs import MODEL

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
    return sum(sync_redis().xlen(keys.queue(MODEL, tier)) for tier in keys.TIERS)


def _with_answers(key: str, body: dict, *answers: list[tuple[str, dict]]) -> tuple[Any, list[dict], str]:
    """POST a completion of len(answers) choices while the worker double answers each."""
    return worker_double.post_answered("/v1/completions", body, _headers(key), *answers)


def _with_answer(key: str, body: dict, *events: tuple[str, dict]) -> tuple[Any, dict, str]:
    response, [job], streamed = _with_answers(key, body, list(events))
    return response, job, streamed


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
        ({"add_special_tokens": False}, "add_special_tokens"),
        ({"use_beam_search": True}, "use_beam_search"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": -2}, "logprobs"),
        ({"n": 2, "temperature": 0}, "n"),
        ({"min_p": 1.5}, "min_p"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
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


def test_vllm_s_sampling_parameters_reach_the_queued_job_as_for_chat(key):
    body = {
        "model": "stable",
        "prompt": PROMPT,
        "seed": 7,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.2,
        "top_k": 5,
        "min_p": 0.1,
        "min_tokens": 2,
        "ignore_eos": True,
        "stop_token_ids": [2],
        "logit_bias": {"50": -200},
        "logprobs": 3,
        "response_format": {"type": "json_object"},
    }
    _, job, _ = _with_answer(key, body, worker_double.done())
    expected = {name: body[name] for name in body if name not in ("model", "prompt", "response_format")}
    expected["logit_bias"] = {"50": -100.0}  # clamped, as vLLM does
    assert {name: job[name] for name in expected} == expected
    assert StructuredOutput.from_dict(job["structured"]) == StructuredOutput(json_object=True)


def test_n_choices_are_n_seeded_generations_answered_together(key):
    response, jobs, _ = _with_answers(
        key,
        {"model": "stable", "prompt": PROMPT, "n": 2, "seed": 10},
        [*worker_double.tokens(" red"), worker_double.done("stop", prompt_tokens=6, completion_tokens=1)],
        [*worker_double.tokens(" blue,"), worker_double.done("length", prompt_tokens=6, completion_tokens=2)],
    )
    assert sorted(job["seed"] for job in jobs) == [10, 11]
    body = response.json()
    assert [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]] == [
        (0, " red", "stop"),
        (1, " blue,", "length"),
    ]
    assert body["usage"] == {"prompt_tokens": 6, "completion_tokens": 3, "total_tokens": 9}


def _logprob_token(seq: int, text: str, logprob: float) -> tuple[str, dict]:
    """A token with its candidates as the engines give them: the sampled one first, then others."""
    candidates = [
        {"token": text, "logprob": logprob, "bytes": None},
        {"token": " green", "logprob": -3.0, "bytes": None},
        {"token": " blue", "logprob": -4.0, "bytes": None},
    ]
    entry = {"token": text, "logprob": logprob, "bytes": None, "top_logprobs": candidates}
    return ("token", {"seq": seq, "text": text, "logprobs": [entry]})


def test_logprobs_come_in_the_completions_shape_with_the_sampled_token_and_that_many_more(key):
    response, _, _ = _with_answer(
        key,
        {"model": "stable", "prompt": PROMPT, "logprobs": 1},
        _logprob_token(0, " red", -0.5),
        _logprob_token(1, ",", -0.25),
        worker_double.done(),
    )
    assert response.json()["choices"][0]["logprobs"] == {
        "tokens": [" red", ","],
        "token_logprobs": [-0.5, -0.25],
        "top_logprobs": [{" red": -0.5, " green": -3.0}, {",": -0.25, " green": -3.0}],
        "text_offset": [0, 4],
    }


def test_streamed_logprobs_count_text_offsets_on_from_the_previous_chunk(key):
    _, _, streamed = _with_answer(
        key,
        {"model": "stable", "prompt": PROMPT, "logprobs": 0, "stream": True},
        _logprob_token(0, " red", -0.5),
        _logprob_token(1, ",", -0.25),
        worker_double.done(),
    )
    chunks = [chunk for chunk in _sse_data(streamed)[:-1] if chunk["choices"][0]["text"]]
    logprobs = [chunk["choices"][0]["logprobs"] for chunk in chunks]
    assert [offset for entry in logprobs for offset in entry["text_offset"]] == [0, 4]
    assert [top for entry in logprobs for top in entry["top_logprobs"]] == [{" red": -0.5}, {",": -0.25}]


def test_the_openapi_document_lists_the_text_completion_s_sampling_parameters():
    document = Client().get("/v1/openapi.json").json()
    properties = document["components"]["schemas"]["CompletionRequest"]["properties"]
    assert {"seed", "presence_penalty", "top_k", "min_p", "min_tokens", "ignore_eos", "logprobs", "n"} <= set(
        properties
    )
    assert "CompletionLogprobs" in document["components"]["schemas"]
