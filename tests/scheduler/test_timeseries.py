"""The console's time series: answers, refusals and queue depths in 10-second buckets."""

import asyncio
import random
from collections import Counter

import pytest

from scheduler import timeseries
from scheduler.admission import AdmissionRefused, request_submit
from scheduler.generation import Timings, Usage
from scheduler.models import TierPolicy
from scheduler.policy import policies_mirror
from scheduler.queues import job_enqueue
from scheduler.redis import new_async_redis, sync_redis
from scheduler.services import GenerationOutcome
from tests.generation_jobs import MODEL, generation_job


def _run(body):
    async def run():
        client = new_async_redis()
        try:
            await body(client)
        finally:
            await client.aclose()

    asyncio.run(run())


def _record_answers(answers: list[dict]) -> None:
    async def body(client):
        for answer in answers:
            await timeseries.answer_record(client, variant=answer["variant"], outcome=answer["outcome"])

    _run(body)


def _answer(variant="stable", status="done", ttft_ms=100.0, output_tokens=11, duration_ms=600.0) -> dict:
    outcome = GenerationOutcome(
        status=status,
        usage=Usage(prompt_tokens=5, completion_tokens=output_tokens),
        timings=Timings(queue_ms=0.0, ttft_ms=ttft_ms, duration_ms=duration_ms, engine="simulated"),
    )
    return {"variant": variant, "outcome": outcome}


def test_percentiles_from_the_bins_are_within_the_bin_resolution():
    rng = random.Random(7)
    values = [rng.lognormvariate(5, 1) for _ in range(5000)]
    bins: Counter[int] = Counter()
    for value in values:
        bins[timeseries.latency_bin(value)] += 1
    exact = sorted(values)
    for quantile in (0.5, 0.95):
        assert timeseries.latency_percentile(bins, quantile) == pytest.approx(
            exact[int(quantile * len(exact)) - 1], rel=0.13
        )
    assert timeseries.latency_percentile(Counter(), 0.5) is None


def test_finished_answers_are_counted_with_their_latencies_and_tokens():
    _record_answers(
        [_answer(), _answer(ttft_ms=200.0, duration_ms=1200.0), _answer(variant="candidate", status="error")]
    )
    buckets = timeseries.series_buckets(seconds=60)
    assert len(buckets) == 6
    answers = sum((b.answers for b in buckets), start=Counter())
    assert answers == {("stable", "done"): 2, ("candidate", "error"): 1}
    assert sum(b.output_tokens for b in buckets) == 33
    ttft = timeseries.merged_bins(b.ttft_bins for b in buckets)
    assert timeseries.latency_percentile(ttft, 0.5) == pytest.approx(100, rel=0.13)
    itl = timeseries.merged_bins(b.itl_bins for b in buckets)
    # (600 - 100) / 10 twice, (1200 - 200) / 10 once
    assert sorted(itl.elements()) == [timeseries.latency_bin(50)] * 2 + [timeseries.latency_bin(100)]


@pytest.mark.django_db
def test_refusals_are_counted_by_reason():
    TierPolicy.objects.filter(tier="normal").update(bucket_capacity=1, refill_per_s=0.001)
    policies_mirror()
    request_submit(job=generation_job(client_id="user:1"))
    for _ in range(3):
        with pytest.raises(AdmissionRefused):
            request_submit(job=generation_job(client_id="user:1"))
    refusals = sum((b.refusals for b in timeseries.series_buckets(seconds=30)), start=Counter())
    assert refusals == {"rate_limited_user": 3}


def test_a_workers_heartbeat_samples_its_models_queue_depths():
    for n in range(4):
        job_enqueue(
            tier="normal" if n else "vip",
            job=generation_job(f"r{n}"),
            max_queued=100,
            wait_slo_s=1000,
            max_wait_s=60,
        )
    _run(lambda client: timeseries.queue_depth_record(client, model=MODEL))
    current = timeseries.series_buckets(seconds=10)[-1]
    assert current.queue_depth == {(MODEL, "vip"): 1, (MODEL, "normal"): 3, (MODEL, "batch"): 0}


def test_buckets_expire_after_the_retention():
    _record_answers([_answer()])
    (key,) = sync_redis().keys("llm:series:*")
    assert 0 < sync_redis().ttl(key) <= timeseries.RETENTION_S
