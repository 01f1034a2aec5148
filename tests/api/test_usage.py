"""Each API key's usage per day, from the generation records: on the console's API keys page
and in /metrics, named by the key's prefix and never by its secret."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.test import Client, RequestFactory
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from accounts.models import User
from admin_console.metrics_view import metrics
from api import keys as api_keys
from api.models import BatchJob, BatchJobItem
from api.usage import KeyUsage, key_usage_by_day
from scheduler.generation import Origin, Tier
from scheduler.models import Generation

pytestmark = pytest.mark.django_db


def _answer(
    client_id: str,
    *,
    status: str = "done",
    prompt: int = 10,
    completion: int = 5,
    days_ago: int = 0,
    choice: int = 0,
):
    generation = Generation.objects.create(
        request_id=uuid.uuid4(),
        origin=Origin.API,
        variant="stable",
        tier=Tier.NORMAL,
        client_id=client_id,
        choice=choice,
        status=status,
        prompt_tokens=prompt,
        completion_tokens=completion,
    )
    if days_ago:
        Generation.objects.filter(pk=generation.pk).update(
            created_at=timezone.now() - timedelta(days=days_ago)
        )


@pytest.fixture
def issued():
    return api_keys.api_key_create(owner=User.objects.create(username="alice"), name="billing")


def test_usage_counts_requests_errors_and_tokens_per_key_and_day(issued):
    key = issued.api_key
    _answer(key.client_id)
    _answer(key.client_id, status="error", prompt=4, completion=0)
    _answer(key.client_id, days_ago=1, prompt=100, completion=50)
    _answer("user:1")  # a chat answer: not a key's
    usage = key_usage_by_day(days=7)
    today = timezone.now().date()
    assert usage[key.pk][today] == KeyUsage(requests=2, errors=1, prompt_tokens=14, completion_tokens=5)
    assert usage[key.pk][today - timedelta(days=1)] == KeyUsage(1, 0, 100, 50)
    assert list(usage) == [key.pk]
    assert key_usage_by_day(days=1)[key.pk] == {today: usage[key.pk][today]}


def test_a_call_of_n_choices_counts_one_request_and_its_prompt_once_as_its_response_does(issued):
    key = issued.api_key
    for choice in range(3):
        _answer(key.client_id, prompt=10, completion=5, choice=choice)
    today = timezone.now().date()
    assert key_usage_by_day(days=1)[key.pk][today] == KeyUsage(
        requests=1, prompt_tokens=10, completion_tokens=15
    )


def test_a_key_s_batch_jobs_count_in_its_usage(issued):
    key = issued.api_key
    _answer(key.client_id, prompt=10, completion=5)
    job = BatchJob.objects.create(owner=key.owner, api_key=key)
    for index, status in enumerate(("done", "error")):
        generation = Generation.objects.create(
            request_id=uuid.uuid4(),
            origin=Origin.BATCH,
            variant="stable",
            tier=Tier.BATCH,
            client_id=job.client_id,  # the owner's batch client, not the key
            status=status,
            prompt_tokens=20,
            completion_tokens=7 if status == "done" else 0,
        )
        BatchJobItem.objects.create(job=job, index=index, request={}, generation=generation)
    today = timezone.now().date()
    assert key_usage_by_day(days=1)[key.pk][today] == KeyUsage(
        requests=3, errors=1, prompt_tokens=50, completion_tokens=12
    )


def test_metrics_export_today_s_usage_by_key_prefix_never_the_secret(issued):
    key = issued.api_key
    _answer(key.client_id, prompt=12, completion=7)
    _answer(key.client_id, status="error", prompt=3, completion=0)
    _answer(key.client_id, days_ago=2, prompt=1000)
    text = metrics(RequestFactory().get("/metrics", REMOTE_ADDR="127.0.0.1")).content.decode()
    assert issued.plaintext not in text
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("llm_api_key_")
    }
    assert samples[("llm_api_key_requests_today", (("key", key.prefix),))] == 2
    assert samples[("llm_api_key_errors_today", (("key", key.prefix),))] == 1
    assert samples[("llm_api_key_tokens_today", (("key", key.prefix), ("kind", "prompt")))] == 15
    assert samples[("llm_api_key_tokens_today", (("key", key.prefix), ("kind", "completion")))] == 7


@pytest.fixture
def staff_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_user("sam", password="pw", is_staff=True))
    return client


def test_the_console_shows_each_key_s_usage_today_and_over_the_week(issued, staff_client):
    _answer(issued.api_key.client_id, prompt=12, completion=7)
    _answer(issued.api_key.client_id, days_ago=3, prompt=100, completion=1)
    page = staff_client.get("/console/api-keys").content.decode()
    row = page[page.index(f'id="api-key-{issued.api_key.pk}"') :]
    today = row[row.index('class="usage-today"') : row.index('class="usage-week"')]
    week = row[row.index('class="usage-week"') :][:200]
    assert "1 requests, 0 errors" in today and "12 + 7 tokens" in today
    assert "2 requests, 0 errors" in week and "120 tokens" in week
