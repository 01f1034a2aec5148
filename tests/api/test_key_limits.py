"""An API key's own requests and tokens per minute: 429 with Retry-After and OpenAI's
x-ratelimit-* headers, tokens reserved at admission and settled with what the answer used."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import Client

from accounts.models import User
from api import keys as api_keys
from api.models import ApiKey
from api.openai_shapes import ratelimit_duration
from scheduler import keys
from scheduler.admission import request_finished
from scheduler.models import Generation, TierPolicy
from scheduler.policy import policies_mirror
from scheduler.redis import new_async_redis, sync_redis
from tests import worker_double

pytestmark = pytest.mark.django_db

PROMPT = "Write a haiku about parcels"
RATELIMIT_HEADERS = {
    f"x-ratelimit-{part}-{kind}"
    for part in ("limit", "remaining", "reset")
    for kind in ("requests", "tokens")
}


@pytest.fixture(autouse=True)
def roomy_tier():
    """The tier's own limits out of the way: these tests are about the key's."""
    TierPolicy.objects.filter(tier="normal").update(
        max_concurrent_per_user=100, bucket_capacity=100, tier_bucket_capacity=1000
    )
    policies_mirror()


def _key(**limits: int) -> tuple[ApiKey, str]:
    issued = api_keys.api_key_create(
        owner=User.objects.create(username=f"owner-{len(limits)}-{sorted(limits)}")
    )
    ApiKey.objects.filter(pk=issued.api_key.pk).update(**limits)
    issued.api_key.refresh_from_db()
    return issued.api_key, issued.plaintext


def _complete(plaintext: str, path: str = "/v1/completions", **extra: Any) -> Any:
    body = {"model": "stable", "prompt": PROMPT, "max_tokens": 20, **extra}
    if path == "/v1/chat/completions":
        body = {"model": "stable", "messages": [{"role": "user", "content": body.pop("prompt")}], **body}
    # Streamed: the answer is admitted and its headers sent before any token exists.
    return Client().post(
        path,
        json.dumps({**body, "stream": True}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {plaintext}"},
    )


def _reset_s(value: str) -> float:
    """OpenAI's duration ("20ms", "1.5s", "6m0s") in seconds."""
    total = 0.0
    for number, unit in re.findall(r"([\d.]+)(ms|h|m|s)", value):
        total += float(number) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    return total


def test_a_key_with_2_requests_per_minute_gets_429_on_the_third_with_openai_headers():
    _, plaintext = _key(requests_per_minute=2)
    first, second = _complete(plaintext), _complete(plaintext, "/v1/chat/completions")
    assert (first.status_code, second.status_code) == (200, 200)
    assert (first["x-ratelimit-limit-requests"], first["x-ratelimit-remaining-requests"]) == ("2", "1")
    assert second["x-ratelimit-remaining-requests"] == "0"
    # Two of two used, 2 a minute regained: full again in about a minute.
    assert _reset_s(second["x-ratelimit-reset-requests"]) == pytest.approx(60, abs=1)

    third = _complete(plaintext)
    assert third.status_code == 429
    assert third.json()["error"]["code"] == "rate_limit_exceeded"
    assert third.json()["error"]["type"] == "requests"
    # One request comes back every 30 s.
    assert 29 <= int(third["Retry-After"]) <= 31
    assert third["x-ratelimit-remaining-requests"] == "0"
    assert "x-ratelimit-limit-tokens" not in third  # the key has no tokens limit
    assert len(worker_double.queued("normal")) == 2


def test_tokens_are_reserved_at_admission_and_settled_with_what_the_answer_used():
    api_key, plaintext = _key(tokens_per_minute=100)
    first = _complete(plaintext, max_tokens=60)
    assert first.status_code == 200
    [job] = worker_double.queued("normal")
    reserved = 100 - int(first["x-ratelimit-remaining-tokens"])
    assert reserved > 60  # the prompt's tokens and max_tokens

    refused = _complete(plaintext, max_tokens=60)
    assert refused.status_code == 429
    assert refused.json()["error"]["type"] == "tokens"
    assert int(refused["Retry-After"]) >= 1

    # The answer used 10 tokens in all: the other reserved ones come back at once.
    async_to_sync(request_finished)(
        new_async_redis(), client_id=api_key.client_id, request_id=job["request_id"], tokens_used=10
    )
    admitted = _complete(plaintext, max_tokens=60)
    assert admitted.status_code == 200
    assert int(admitted["x-ratelimit-remaining-tokens"]) == pytest.approx(100 - 10 - reserved, abs=2)


def test_settling_twice_gives_back_the_reservation_once():
    api_key, plaintext = _key(tokens_per_minute=100)
    assert _complete(plaintext, max_tokens=50).status_code == 200
    [job] = worker_double.queued("normal")
    for _ in range(2):
        async_to_sync(request_finished)(
            new_async_redis(), client_id=api_key.client_id, request_id=job["request_id"], tokens_used=30
        )
    response = Client().get("/v1/models", headers={"Authorization": f"Bearer {plaintext}"})
    assert int(response["x-ratelimit-remaining-tokens"]) == pytest.approx(70, abs=2)


def test_a_request_larger_than_the_tokens_per_minute_is_refused_for_good():
    _, plaintext = _key(tokens_per_minute=50)
    response = _complete(plaintext, max_tokens=60)
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "rate_limit_exceeded"
    assert "Retry-After" not in response
    assert response["x-should-retry"] == "false"
    assert worker_double.queued("normal") == []


def test_every_answer_to_a_limited_key_carries_the_headers_and_an_unlimited_key_none():
    _, limited = _key(requests_per_minute=5, tokens_per_minute=1000)
    _, unlimited = _key()
    for plaintext, expected in ((limited, RATELIMIT_HEADERS), (unlimited, set())):
        client = Client()
        auth = {"Authorization": f"Bearer {plaintext}"}
        models = client.get("/v1/models", headers=auth)
        invalid = client.post("/v1/completions", "{}", content_type="application/json", headers=auth)
        assert invalid.status_code == 400
        for response in (models, invalid):
            assert {name for name in RATELIMIT_HEADERS if response.has_header(name)} == expected
    # Reading the limits spends nothing.
    response = Client().get("/v1/models", headers={"Authorization": f"Bearer {limited}"})
    assert (response["x-ratelimit-remaining-requests"], response["x-ratelimit-remaining-tokens"]) == (
        "5",
        "1000",
    )
    assert response["x-ratelimit-reset-requests"] == "0s"


@pytest.mark.parametrize(
    ("seconds", "written"),
    [(0, "0s"), (0.0201, "21ms"), (1.5, "1.5s"), (59.25, "59.25s"), (360, "6m0s"), (3723, "1h2m3s")],
)
def test_waits_are_written_as_openai_writes_them(seconds, written):
    assert ratelimit_duration(seconds) == written


def test_n_choices_refused_part_way_charge_the_key_nothing():
    """The third of three choices does not fit the key's requests per minute: the call is
    refused, the two admitted choices are withdrawn and the key has its two requests back."""
    _, plaintext = _key(requests_per_minute=2, tokens_per_minute=1000)
    refused = _complete(plaintext, n=3, temperature=1)
    assert refused.status_code == 429
    assert refused.json()["error"]["type"] == "requests"
    queued = worker_double.queued("normal")
    assert len(queued) == 2 and all(sync_redis().exists(keys.cancel(job["request_id"])) for job in queued)
    assert not Generation.objects.exists()  # a refused call leaves no record to count

    response = Client().get("/v1/models", headers={"Authorization": f"Bearer {plaintext}"})
    assert response["x-ratelimit-remaining-requests"] == "2"
    assert int(response["x-ratelimit-remaining-tokens"]) == pytest.approx(1000, abs=2)
    assert _complete(plaintext, n=2, temperature=1).status_code == 200
