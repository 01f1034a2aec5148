"""The result cache through real processes (web, simulated worker): what customers, API callers
and staff see over HTTP."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from scheduler import keys
from tests.e2e.client import ChatClient, StreamResult
from tests.e2e.conftest import running_stack
from tests.generation_jobs import MODEL

pytestmark = pytest.mark.e2e

TOKEN = "e2e-metrics-token"
RETURNS = "You can return most items within 30 days of delivery, unused and in their box."
QUESTION = "How long do I have to return an item?"


@pytest.fixture(scope="module")
def stack():
    yield from running_stack(METRICS_TOKEN=TOKEN, ANSWER_CACHE_ENABLED="true")


def _jobs_enqueued(stack) -> int:
    client = redis.Redis.from_url(stack.redis.url, decode_responses=True)
    try:
        return sum(int(client.get(keys.enqueue_seq(MODEL, tier)) or 0) for tier in keys.TIERS)
    finally:
        client.close()


async def _guest_asks(stack, text: str) -> StreamResult:
    async with ChatClient(stack.base_url) as guest:
        conversation = await guest.open_page()
        return await guest.stream(await guest.ask(conversation, text))


async def _staff(stack) -> ChatClient:
    staff = ChatClient(stack.base_url)
    await staff.login("sam", stack.staff_password)
    return staff


async def _staff_post(staff: ChatClient, url: str, data: dict) -> httpx.Response:
    await staff.http.get("/console/")
    return await staff.http.post(url, data={**data, "csrfmiddlewaretoken": staff.csrf})


def test_a_repeated_question_is_answered_from_the_cache_until_its_article_changes(stack):
    async def scenario():
        async with await _staff(stack) as staff:
            created = await _staff_post(
                staff,
                "/console/knowledge/new",
                {"title": "Returns policy", "slug": "returns", "body": RETURNS},
            )
            assert created.status_code == 302, created.text
            first = await _guest_asks(stack, QUESTION)
            enqueued = _jobs_enqueued(stack)
            second = await _guest_asks(stack, QUESTION.lower().rstrip("?"))
            enqueued_after_hit = _jobs_enqueued(stack)
            (article,) = stack.db_rows("SELECT id FROM knowledge_article WHERE slug = %s", ("returns",))
            edited = await _staff_post(
                staff,
                f"/console/knowledge/{article['id']}",
                {"title": "Returns policy", "slug": "returns", "body": RETURNS.replace("30", "14")},
            )
            assert edited.status_code == 302, edited.text
            third = await _guest_asks(stack, QUESTION)
            return first, second, third, enqueued, enqueued_after_hit

    first, second, third, enqueued, enqueued_after_hit = asyncio.run(scenario())
    assert first.terminal.data["cached"] is False
    assert (second.terminal.event, second.terminal.data["cached"]) == ("done", True)
    assert second.text == first.text
    assert enqueued_after_hit == enqueued  # the hit took no queue, no worker, no GPU slot
    assert third.terminal.data["cached"] is False  # the article it was written from changed


def test_a_signed_in_customers_question_with_their_name_is_never_cached(stack):
    async def scenario():
        async with ChatClient(stack.base_url) as alice:
            await alice.login("alice", "alice-demo-pass")
            results = []
            for _ in range(2):
                conversation = await alice.new_conversation()
                request_id = await alice.ask(conversation, "Alice here: do you ship abroad?")
                results.append((request_id, await alice.stream(request_id)))
            return results

    for request_id, result in asyncio.run(scenario()):
        assert (result.terminal.event, result.terminal.data["cached"]) == ("done", False)
        (row,) = stack.db_rows(
            "SELECT cache FROM scheduler_generation WHERE request_id = %s", (stack.db_uuid(request_id),)
        )
        assert row["cache"] == ""  # not even looked up


def test_a_pinned_answer_is_served_to_a_paraphrase(stack):
    pinned = "Start a return from your orders page; we refund within five working days."

    async def scenario():
        async with await _staff(stack) as staff:
            response = await _staff_post(
                staff,
                "/console/cache/pin",
                {"variant": "stable", "question": "How do I get a refund?", "answer": pinned},
            )
            assert response.status_code == 302, response.text
        return await _guest_asks(stack, "how do i get a refund")

    result = asyncio.run(scenario())
    assert result.text == pinned
    assert result.terminal.data["cached"] is True


def test_an_api_call_repeated_is_answered_from_the_cache_in_the_same_shape(stack):
    key = stack.create_api_key("alice")
    # Greedy: an answer that does not depend on chance (a sampled one is a fresh sample each time).
    body = {
        "model": "stable",
        "messages": [{"role": "user", "content": "Do you sell gift cards?"}],
        "temperature": 0,
    }
    headers = {"Authorization": f"Bearer {key}"}
    first = httpx.post(f"{stack.base_url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    second = httpx.post(f"{stack.base_url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert first.status_code == second.status_code == 200
    assert second.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]
    assert second.json()["choices"][0]["finish_reason"] == "stop"
    rows = stack.db_rows("SELECT cache FROM scheduler_generation WHERE origin = 'api' ORDER BY id")
    assert [row["cache"] for row in rows][-2:] == ["miss", "exact"]


def test_the_console_and_metrics_show_hits_saved_engine_time_and_lookup_latency(stack):
    async def scenario():
        async with await _staff(stack) as staff:
            return (await staff.http.get("/console/cache")).text

    page = asyncio.run(scenario())
    assert 'data-lookups="0"' not in page
    assert "Engine time saved" in page
    scrape = httpx.get(f"{stack.base_url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    samples = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(scrape.text)
        for sample in family.samples
    }
    hits = sum(
        value
        for (name, labels), value in samples.items()
        if name == "llm_answer_cache_lookups_total" and dict(labels)["result"] != "miss"
    )
    assert hits >= 3
    assert samples[("llm_answer_cache_lookup_seconds_count", frozenset())] >= 4
    saved = [
        value for (name, _), value in samples.items() if name == "llm_answer_cache_saved_engine_seconds_total"
    ]
    assert sum(saved) > 0
