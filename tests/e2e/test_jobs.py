"""Submit-then-poll jobs through real processes: web, inference worker, Celery worker with beat."""

from __future__ import annotations

import asyncio
import logging
import statistics
import time

import httpx
import openai
import pytest
import redis

from scheduler import keys
from tests.e2e.conftest import running_stack
from tests.generation_jobs import MODEL

pytestmark = pytest.mark.e2e

logger = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def stack():
    stack_iter = running_stack(
        INFERENCE_MAX_NUM_SEQS="8",
        VIP_RESERVED_SLOTS="2",
        BATCH_MAX_SLOTS="4",
        SIMULATED_OUTPUT_TOKENS="30",
        SIMULATED_DECODE_BASE_S="0.02",  # an answer takes about 1 s
        BATCH_JOB_LEASE_S="3",
        BATCH_JOB_RESUME_S="1",
        BATCH_JOB_SLICE_S="5",  # jobs outlive a slice: the hand-over to a fresh task is exercised
    )
    stack = next(stack_iter)
    try:
        stack.start_celery()
        yield stack
    finally:
        stack_iter.close()  # stops every process of the stack


@pytest.fixture(scope="module")
def job_key(stack) -> str:
    return stack.create_api_key("alice")


def _requests(count: int, topic: str) -> list[dict]:
    return [
        {"model": "stable", "messages": [{"role": "user", "content": f"{topic} question {n}"}]}
        for n in range(count)
    ]


def _submit(stack, key: str, requests: list[dict]) -> str:
    response = httpx.post(
        f"{stack.base_url}/v1/jobs", json={"requests": requests}, headers={"Authorization": f"Bearer {key}"}
    )
    assert response.status_code == 202, response.text
    return response.json()["id"]


def _job(stack, key: str, job_id: str) -> dict:
    response = httpx.get(f"{stack.base_url}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    return response.json()


def _wait(stack, key: str, job_id: str, until, timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = _job(stack, key, job_id)
        if until(job):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not get there in {timeout_s}s: {job['status']} {job['progress']}")


def _batch_enqueued(stack) -> int:
    """How many batch requests were ever queued (each submission counts once)."""
    client = redis.Redis.from_url(stack.redis.url, decode_responses=True)
    return int(client.get(keys.enqueue_seq(MODEL, "batch")) or 0)


def _request_ids(stack, job_id: str) -> dict[int, str]:
    rows = stack.db_rows(
        'SELECT "index", request_id FROM chat_batchjobitem WHERE job_id = %s AND request_id IS NOT NULL',
        (stack.db_uuid(job_id),),
    )
    return {row["index"]: row["request_id"] for row in rows}


def _assert_all_answered(job: dict, topic: str) -> None:
    assert job["status"] == "completed"
    assert job["progress"]["completed"] == job["progress"]["total"]
    for n, result in enumerate(job["results"]):
        assert (result["index"], result["status"]) == (n, "completed")
        content = result["response"]["choices"][0]["message"]["content"]
        assert content.startswith(f"[simulated] You asked: {topic} question {n} ")
        assert result["response"]["usage"]["completion_tokens"] == 30


async def _vip_ttft_s(stack, key: str, n: int) -> float:
    client = openai.AsyncOpenAI(base_url=stack.base_url + "/v1", api_key=key, max_retries=0)
    started = time.monotonic()
    ttft = None
    stream = await client.chat.completions.create(
        model="stable", messages=[{"role": "user", "content": f"VIP question {n}"}], stream=True
    )
    text = ""
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            ttft = ttft if ttft is not None else time.monotonic() - started
            text += chunk.choices[0].delta.content
    await client.close()
    assert text.startswith(f"[simulated] You asked: VIP question {n}")
    return ttft


def test_a_job_of_fifty_completes_while_vip_requests_are_served(stack, job_key):
    vip_key = stack.create_api_key("victor")
    started = time.monotonic()
    job_id = _submit(stack, job_key, _requests(50, "Batch"))
    _wait(stack, job_key, job_id, lambda job: job["progress"]["completed"] >= 1)

    async def vip_traffic() -> list[float]:
        ttfts = []
        for wave in range(3):
            ttfts += await asyncio.gather(*(_vip_ttft_s(stack, vip_key, wave * 4 + n) for n in range(4)))
        return ttfts

    ttfts = asyncio.run(vip_traffic())
    during = _job(stack, job_key, job_id)
    logger.info(
        "12 VIP requests while the job ran: TTFT median %.0f ms, max %.0f ms; job then at %s",
        statistics.median(ttfts) * 1000,
        max(ttfts) * 1000,
        during["progress"],
    )
    # VIP requests were served while the job ran.
    assert during["status"] == "running" and during["progress"]["completed"] < 50

    job = _wait(stack, job_key, job_id, lambda job: job["status"] != "running")
    logger.info("the job of 50 took %.1f s", time.monotonic() - started)
    _assert_all_answered(job, "Batch")


def test_a_job_survives_its_celery_worker_being_killed(stack, job_key):
    enqueued_before = _batch_enqueued(stack)
    job_id = _submit(stack, job_key, _requests(20, "Resumed"))
    _wait(stack, job_key, job_id, lambda job: job["progress"]["completed"] >= 3)
    [celery] = stack.celery_workers
    stack.kill_celery(celery)
    submitted_before_kill = _request_ids(stack, job_id)
    assert submitted_before_kill
    stack.start_celery()
    job = _wait(stack, job_key, job_id, lambda job: job["status"] != "running")
    _assert_all_answered(job, "Resumed")
    # Requests submitted before the crash were followed again, not submitted again.
    after = _request_ids(stack, job_id)
    assert {n: after[n] for n in submitted_before_kill} == submitted_before_kill
    assert _batch_enqueued(stack) - enqueued_before == 20


def test_a_cancelled_job_stops_submitting_and_keeps_its_finished_answers(stack, job_key):
    job_id = _submit(stack, job_key, _requests(40, "Cancelled"))
    _wait(stack, job_key, job_id, lambda job: job["progress"]["completed"] >= 2)
    response = httpx.post(
        f"{stack.base_url}/v1/jobs/{job_id}/cancel", headers={"Authorization": f"Bearer {job_key}"}
    )
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    time.sleep(1.5)  # the feeding task notices within its lease renewal
    enqueued = _batch_enqueued(stack)
    time.sleep(2)
    assert _batch_enqueued(stack) == enqueued, "requests were still submitted after the cancel"
    job = _job(stack, job_key, job_id)
    progress = job["progress"]
    assert progress["pending"] == progress["submitted"] == 0
    assert progress["completed"] >= 2 and progress["cancelled"] > 0
    for result in job["results"]:
        assert result["status"] in {"completed", "cancelled"}
        if result["status"] == "completed":
            assert result["response"]["choices"][0]["message"]["content"].startswith("[simulated]")
