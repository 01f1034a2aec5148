"""Hostile input, generated: every parser of client input answers a clear 4xx or accepts, and
never fails with a 500 or an exception.

The API part walks every route under /v1 (api.urls), so a new endpoint is covered here
without anyone extending this file. The chat part fills the chat's form fields and the headers
its views read.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from django.test import Client, override_settings
from django.urls import URLPattern
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounts.models import User
from api import keys as api_keys
from api import urls as api_urls
from api.errors import ApiError, chat_request_parse, job_requests_parse
from chat.models import Conversation, Message
from scheduler import keys
from scheduler.models import TierPolicy
from scheduler.policy import policies_mirror
from scheduler.redis import sync_redis
from tests.chat.conftest import guest_key_of
from tests.generation_jobs import MODEL

pytestmark = [pytest.mark.django_db, pytest.mark.security]

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
VALID = {"model": "stable", "messages": [{"role": "user", "content": "Where is my parcel?"}]}
FIELDS = [*VALID, "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "stream",
          "stream_options", "n", "tools", "seed", "response_format", "user"]  # fmt: skip
# A valid request with one field replaced by anything: reaches each field's own checks.
near_valid = st.builds(lambda name, value: VALID | {name: value}, st.sampled_from(FIELDS), json_values)
message_like = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]) | json_values,
     "content": st.text() | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text()}))
     | json_values},
)  # fmt: skip
with_messages = st.lists(message_like, max_size=5).map(lambda messages: VALID | {"messages": messages})
chat_bodies = json_values | near_valid | with_messages


@FUZZ
@given(chat_bodies)
def test_a_chat_request_is_parsed_or_refused_with_a_400(body: Any) -> None:
    try:
        chat_request_parse(body)
    except ApiError as exc:
        assert exc.status == 400 and exc.message


@FUZZ
@given(json_values | st.lists(chat_bodies, max_size=3).map(lambda requests: {"requests": requests}))
def test_a_job_body_is_parsed_or_refused_with_a_400(body: Any) -> None:
    try:
        job_requests_parse(body)
    except ApiError as exc:
        assert exc.status == 400 and exc.message


@pytest.fixture
def key() -> str:
    return api_keys.api_key_create(owner=User.objects.create(username="alice")).plaintext


def _api_routes() -> list[tuple[str, str]]:
    """(method, path) of every /v1 route, with its path parameters filled in."""
    fill = {
        "<uuid:job_id>": str(uuid.uuid4()),
        "<path:model_id>": "stable",
        "^(?P<path>[\\s\\S]*)$": "jobs/x",
    }
    routes = []
    for pattern in api_urls.urlpatterns:
        assert isinstance(pattern, URLPattern)
        path = "/v1/" + str(pattern.pattern)
        for placeholder, value in fill.items():
            path = path.replace(placeholder, value)
        assert "<" not in path, f"no value to fill in {path}: add one above"
        routes += [("GET", path), ("POST", path)]
    return routes


bodies = (
    st.binary(max_size=300)
    | json_values.map(lambda v: json.dumps(v).encode())
    | chat_bodies.map(lambda v: json.dumps(v).encode())
)
authorization = st.sampled_from(["", "Bearer ", "bearer sk-", "Basic x"]) | st.text(
    st.characters(min_codepoint=32, max_codepoint=126), max_size=60
)


@pytest.mark.parametrize(("method", "path"), _api_routes())
def test_every_api_route_answers_hostile_input_in_openai_s_error_shape(key, method, path):
    # Full queues: a request that passes every parser is refused (503) instead of waiting for
    # an answer no worker here would give.
    TierPolicy.objects.update(max_queued=0)
    policies_mirror()

    @FUZZ
    @given(body=bodies, auth=authorization, use_key=st.booleans())
    def check(body: bytes, auth: str, use_key: bool) -> None:
        headers = {"Authorization": f"Bearer {key}" if use_key else auth}
        client = Client()
        if method == "POST":
            response = client.post(path, body, content_type="application/json", headers=headers)
        else:
            response = client.get(path, headers=headers)
        # A full queue is an honest 503 with Retry-After (valid requests pile up: no worker runs
        # here); any other 5xx is a fault.
        busy = response.status_code == 503 and "Retry-After" in response.headers
        assert response.status_code < 500 or busy, response.content
        if response.status_code >= 400:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}

    check()
    assert sync_redis().xlen(keys.queue(MODEL, "normal")) == 0


# --- the chat's form fields and the headers its views read -----------------------------------------


@pytest.fixture
def guest_conversation() -> tuple[Client, Conversation]:
    client = Client()
    client.get("/")
    return client, Conversation.objects.create(session_key=guest_key_of(client))


@pytest.fixture
def customer() -> Client:
    client = Client()
    client.force_login(User.objects.create_user("carol", password="pw"))
    return client


@override_settings(TRUSTED_PROXIES=["127.0.0.1"])
@FUZZ
@given(
    text=st.text(max_size=5000),
    forwarded=st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=80),
    accept=st.sampled_from(["", "application/json", "*/*"]),
)
def test_a_posted_message_is_stored_as_typed_or_refused_with_a_400(
    guest_conversation, text, forwarded, accept
):
    client, conversation = guest_conversation
    sync_redis().flushdb()  # a fresh rate limit for each example
    Message.objects.filter(conversation=conversation).delete()
    response = client.post(
        f"/chat/{conversation.pk}/messages",
        {"text": text},
        headers={"X-Forwarded-For": forwarded, "Accept": accept},
        REMOTE_ADDR="127.0.0.1",
    )
    assert response.status_code in {202, 400}, response.content
    stored = Message.objects.filter(conversation=conversation, role="user").values_list("content", flat=True)
    if response.status_code == 202:
        assert sync_redis().xlen(keys.queue(MODEL, "normal")) == 1
        assert len(stored) == 1
    else:
        assert not stored


@FUZZ
@given(value=st.text(max_size=50), message_id=st.integers(min_value=0, max_value=2**31))
def test_feedback_takes_up_or_down_and_refuses_anything_else(customer, value, message_id):
    response = customer.post(
        f"/chat/messages/{message_id}/feedback", {"value": value}, headers={"Accept": "application/json"}
    )
    assert response.status_code in {400, 404, 409}
