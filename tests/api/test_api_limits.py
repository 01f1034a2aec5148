"""What one API call may ask for: caps on messages, characters and body size, and prompts that
the model's context cannot hold, all refused before anything is queued."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.test import Client

from accounts.models import User
from api import keys as api_keys
from inference.model_prep import default_model_dir, prepare_model
from scheduler import keys
from scheduler.prompt import prompt_encoder
from scheduler.redis import sync_redis
from tests import worker_double
from tests.generation_jobs import MODEL

pytestmark = [pytest.mark.django_db, pytest.mark.security]

ERROR_FIELDS = {"message", "type", "param", "code"}


@pytest.fixture
def key() -> str:
    return api_keys.api_key_create(owner=User.objects.create(username="alice")).plaintext


@pytest.fixture(scope="module")
def model_dir() -> Path:
    model_dir = default_model_dir(Path(django_settings.BASE_DIR))
    prepare_model(output=model_dir)
    return model_dir


def _post(key: str, body: Any, path: str = "/v1/chat/completions") -> Any:
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    headers = {"Authorization": f"Bearer {key}"}
    return Client().post(path, data, content_type="application/json", headers=headers)


def _chat(*contents: str, **extra: Any) -> dict[str, Any]:
    return {"model": "stable", "messages": [{"role": "user", "content": c} for c in contents], **extra}


def _queued_anywhere() -> int:
    return sum(sync_redis().xlen(keys.queue(MODEL, tier)) for tier in keys.TIERS)


def _refused(response: Any, status: int, param: str | None) -> dict[str, Any]:
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == ERROR_FIELDS and error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert _queued_anywhere() == 0
    return error


def test_too_many_messages_get_400(key, settings):
    settings.API_MAX_MESSAGES = 3
    error = _refused(_post(key, _chat("a", "b", "c", "d")), 400, "messages")
    assert "1 to 3 messages" in error["message"]
    _post(key, _chat("a", "b", "c", stream=True))
    assert len(worker_double.queued("normal")) == 1


def test_too_many_characters_get_400(key, settings):
    settings.API_MAX_PROMPT_CHARS = 10
    error = _refused(_post(key, _chat("12345", "123456")), 400, "messages")
    assert "11 characters" in error["message"]


def test_a_body_over_the_cap_gets_413_in_openai_shape(key, settings):
    settings.API_MAX_BODY_BYTES = 1000
    error = _refused(_post(key, _chat("x" * 1000)), 413, None)
    assert error["code"] == "request_too_large"
    job = {"requests": [_chat("x" * 100) for _ in range(10)]}
    assert _post(key, job, "/v1/jobs").status_code == 413


def test_a_prompt_longer_than_the_context_is_refused_before_it_is_queued(key, settings, model_dir):
    settings.INFERENCE_MODEL = str(model_dir)
    settings.INFERENCE_MAX_MODEL_LEN = 100
    question = "Where is my parcel? " * 8
    prompt_tokens = len(prompt_encoder(str(model_dir)).encode(_chat(question)["messages"]))
    assert prompt_tokens < 100
    over = 100 - prompt_tokens + 1
    error = _refused(_post(key, _chat(question, max_tokens=over)), 400, "messages")
    assert error["code"] == "context_length_exceeded"
    assert error["message"].startswith("This model's maximum context length is 100 tokens.")
    assert f"({prompt_tokens} in the messages, {over} in the completion)" in error["message"]
    # Exactly full is fine.
    assert _post(key, _chat(question, max_tokens=100 - prompt_tokens, stream=True)).status_code == 200


def test_without_the_model_s_tokenizer_a_conservative_bound_refuses_long_prompts(key, settings, tmp_path):
    settings.INFERENCE_MODEL = str(tmp_path)  # the simulated engine's case: no tokenizer here
    settings.INFERENCE_MAX_MODEL_LEN = 600
    error = _refused(_post(key, _chat("é" * 150, max_tokens=256)), 400, "messages")
    assert error["code"] == "context_length_exceeded"
    assert _post(key, _chat("Where is my parcel?", max_tokens=256, stream=True)).status_code == 200


def test_a_job_request_longer_than_the_context_is_refused_naming_it(key, settings):
    settings.INFERENCE_MAX_MODEL_LEN = 300
    job = {"requests": [_chat("Hello", max_tokens=8), _chat("Hello " * 300, max_tokens=8)]}
    response = _post(key, job, "/v1/jobs")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "requests[1].messages"
    assert response.json()["error"]["code"] == "context_length_exceeded"
