import asyncio

import pytest
import redis
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families

from scheduler import metrics, routing, workers
from scheduler.admission import AdmissionRefused, request_submit
from scheduler.models import CanaryRouting, Variant, WarmPool
from scheduler.policy import tier_policy
from scheduler.queues import job_enqueue
from scheduler.redis import new_async_redis
from scheduler.results import ResultFollower
from scheduler.warmpool import spares_mirror
from tests.generation_jobs import MODEL, generation_job

pytestmark = pytest.mark.django_db


def _scrape() -> dict[tuple[str, frozenset], float]:
    """The web's /metrics text, as {(sample name, labels): value}."""
    samples = {}
    for family in text_string_to_metric_families(metrics.web_exposition().decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def _value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def _admissions(**labels: str) -> float:
    return metrics.WEB_REGISTRY.get_sample_value("llm_admissions_total", labels) or 0.0


def _enqueue(request_id: str, tier: str, variant: str = "stable", model: str = MODEL) -> None:
    job_enqueue(
        tier=tier,
        job=generation_job(request_id, tier=tier, variant=variant, model=model),
        max_queued=100,
        wait_slo_s=1000,
        max_wait_s=60,
    )


def _heartbeat(worker_id: str, *, jobs_per_s: float, normal_jobs_per_s: float, spare: bool = False) -> None:
    info = {
        "model": MODEL,
        "engine": "simulated",
        "slots": 8,
        "running": 3,
        "draining": False,
        "spare": spare,
        "engine_waiting": 1,
        "kv_cache_usage": 0.25,
        "memory_used_bytes": 300_000_000,
        "memory_total_bytes": 8_000_000_000,
        "memory_source": "process-rss",
        "prefix_cache_queries": 400,
        "prefix_cache_hits": 300,
    }

    async def write() -> None:
        client = new_async_redis()
        try:
            await workers.heartbeat_write(
                client,
                worker_id=worker_id,
                info=info,
                jobs_per_s=jobs_per_s,
                normal_jobs_per_s=normal_jobs_per_s,
            )
        finally:
            await client.aclose()

    asyncio.run(write())


def test_admissions_are_counted_by_tier_outcome_and_reason():
    admitted = _admissions(tier="normal", outcome="admitted", reason="")
    refused = _admissions(tier="normal", outcome="rate_limited", reason="too_many_in_progress")
    limit = tier_policy("normal").max_concurrent_per_user
    for _ in range(limit):
        request_submit(job=generation_job())
    with pytest.raises(AdmissionRefused):
        request_submit(job=generation_job())

    assert _admissions(tier="normal", outcome="admitted", reason="") == admitted + limit
    assert _admissions(tier="normal", outcome="rate_limited", reason="too_many_in_progress") == refused + 1


@pytest.mark.parametrize(
    ("status", "reason", "outcome"),
    [
        (503, "queue_full", "overloaded"),
        (503, "wait_over_slo", "overloaded"),
        (503, "scheduler_unavailable", "unavailable"),
        (429, "rate_limited_global", "rate_limited"),
    ],
)
def test_refusals_are_told_apart_by_what_the_client_can_do(status, reason, outcome):
    before = _admissions(tier="vip", outcome=outcome, reason=reason)
    metrics.admission_record(tier="vip", status=status, reason=reason)
    assert _admissions(tier="vip", outcome=outcome, reason=reason) == before + 1


def test_a_scrape_reads_queues_workers_and_policies_from_redis():
    for n in range(2):
        _enqueue(f"normal-{n}", "normal")
    _enqueue("vip-0", "vip")
    _heartbeat("w1", jobs_per_s=4.0, normal_jobs_per_s=2.0)

    samples = _scrape()

    assert _value(samples, "llm_scheduler_redis_up") == 1
    assert _value(samples, "llm_queue_depth", model=MODEL, tier="normal") == 2
    assert _value(samples, "llm_queue_depth", model=MODEL, tier="vip") == 1
    assert _value(samples, "llm_queue_depth", model=MODEL, tier="batch") == 0
    # A normal request waits behind the VIP queue too: 3 jobs at the 2 normal jobs/s reported.
    assert _value(samples, "llm_queue_predicted_wait_seconds", model=MODEL, tier="normal") == 1.5
    assert _value(samples, "llm_queue_predicted_wait_seconds", model=MODEL, tier="vip") == 0.25
    assert _value(samples, "llm_queue_drain_rate_jobs_per_second", model=MODEL, tier="vip") == 4.0
    for tier in ("vip", "normal", "batch"):
        assert _value(samples, "llm_queue_wait_slo_seconds", tier=tier) == tier_policy(tier).wait_slo_s
    assert _value(samples, "llm_workers_live", model=MODEL) == 1
    worker = {"worker": "w1", "model": MODEL, "engine": "simulated"}
    assert _value(samples, "llm_worker_running_sequences", **worker) == 3
    assert _value(samples, "llm_worker_sequence_slots", **worker) == 8
    assert _value(samples, "llm_worker_engine_waiting_sequences", **worker) == 1
    assert _value(samples, "llm_worker_kv_cache_usage_ratio", **worker) == 0.25
    assert _value(samples, "llm_worker_draining", **worker) == 0
    assert _value(samples, "llm_worker_memory_used_bytes", **worker, source="process-rss") == 300_000_000
    assert _value(samples, "llm_worker_memory_total_bytes", **worker, source="process-rss") == 8_000_000_000
    assert _value(samples, "llm_worker_prefix_cache_queries_total", **worker) == 400
    assert _value(samples, "llm_worker_prefix_cache_hits_total", **worker) == 300
    assert _value(samples, "llm_canary_split_percent", stable="stable", candidate="") == 0


def _next_variant() -> None:
    """A candidate on a model of its own, which no worker serves yet."""
    Variant.objects.create(
        name="next", model="next-model", system_prompt="Be brief.", temperature=0.5, top_p=1.0, max_tokens=64
    )


def test_a_canary_candidate_without_workers_shows_as_a_model_with_none_live():
    _next_variant()
    CanaryRouting.objects.update_or_create(
        pk=1, defaults={"stable_variant": "stable", "candidate_variant": "next", "split_percent": 10}
    )
    routing.canary_mirror()
    _heartbeat("w1", jobs_per_s=4.0, normal_jobs_per_s=2.0)
    _enqueue("canary-0", "normal", variant="next", model="next-model")

    samples = _scrape()

    assert _value(samples, "llm_canary_split_percent", stable="stable", candidate="next") == 10
    assert _value(samples, "llm_workers_live", model=MODEL) == 1
    assert _value(samples, "llm_workers_live", model="next-model") == 0
    assert _value(samples, "llm_queue_depth", model="next-model", tier="normal") == 1


def test_the_desired_worker_count_follows_each_models_admitted_traffic(settings):
    _next_variant()
    settings.AUTOSCALE_TARGET_UTILIZATION = 1.0
    settings.AUTOSCALE_ARRIVAL_WINDOW_S = 30
    settings.SERVICE_TIME_PRIOR_S = 6.0  # the heartbeat reports no measure: 8 slots, 6 below VIP
    CanaryRouting.objects.update_or_create(
        pk=1, defaults={"stable_variant": "stable", "candidate_variant": "next", "split_percent": 10}
    )
    routing.canary_mirror()
    _heartbeat("w1", jobs_per_s=4.0, normal_jobs_per_s=2.0)
    assert _value(_scrape(), "llm_workers_desired", model=MODEL) == 0

    for n in range(100):
        _enqueue(f"normal-{n}", "normal")
    samples = _scrape()

    # 100 admitted over the last 30-35 s and 100 queued for the 60 s SLO: 4.5 to 5 jobs/s, at
    # 1 job/s per worker (6 slots below VIP, 6 s an answer).
    assert _value(samples, "llm_workers_desired", model=MODEL) == 5
    assert _value(samples, "llm_workers_live", model=MODEL) == 1
    assert _value(samples, "llm_workers_desired", model="next-model") == 0


def test_warm_spares_are_counted_apart_from_the_serving_workers():
    _heartbeat("w1", jobs_per_s=4.0, normal_jobs_per_s=2.0)
    _heartbeat("w2", jobs_per_s=0.0, normal_jobs_per_s=0.0, spare=True)
    samples = _scrape()
    assert _value(samples, "llm_workers_live", model=MODEL) == 2
    assert _value(samples, "llm_workers_spare", model=MODEL) == 1
    assert _value(samples, "llm_workers_warm_spares") == 0
    WarmPool.objects.update_or_create(pk=1, defaults={"spares": 2})
    spares_mirror()
    assert _value(_scrape(), "llm_workers_warm_spares") == 2


def test_a_scrape_without_redis_still_answers_and_says_so(monkeypatch):
    def unreachable():
        raise redis.ConnectionError("Connection refused")

    monkeypatch.setattr(metrics, "canary_split", unreachable)

    samples = _scrape()

    assert _value(samples, "llm_scheduler_redis_up") == 0
    assert not any(name == "llm_queue_depth" for name, _ in samples)
    assert any(name.startswith("process_") or name.startswith("python_") for name, _ in samples)


def test_stream_clients_count_the_clients_following_a_result_stream():
    def clients() -> float:
        return metrics.WEB_REGISTRY.get_sample_value("llm_stream_clients")

    async def follow() -> tuple[float, float, float]:
        before = clients()
        follower = ResultFollower()
        async with (
            follower.subscribe(model=MODEL, request_id="r1", after_id="0-0"),
            follower.subscribe(model=MODEL, request_id="r1", after_id="0-0"),
        ):
            during = clients()
        return before, during, clients()

    before, during, after = asyncio.run(follow())
    assert (during - before, after - before) == (2, 0)


# --- who may scrape -------------------------------------------------------------------------------


def _refusal(peer: str, *, authorization: str | None = None, forwarded_for: str | None = None):
    return metrics.scrape_refusal(authorization=authorization, peer_address=peer, forwarded_for=forwarded_for)


def test_without_a_token_only_the_allowed_networks_may_scrape():
    assert _refusal("127.0.0.1") is None
    assert _refusal("::1") is None
    assert _refusal("::ffff:127.0.0.1") is None  # IPv4 loopback through a dual-stack socket
    assert _refusal("10.1.2.3") == 403
    assert _refusal("") == 403
    with override_settings(METRICS_ALLOWED_NETWORKS=["10.0.0.0/8"]):
        assert _refusal("10.1.2.3") is None
        assert _refusal("127.0.0.1") == 403


def test_a_forwarded_request_counts_only_through_a_trusted_proxy():
    # A proxy on this host must not make an outside client look like loopback.
    assert _refusal("127.0.0.1", forwarded_for="203.0.113.9") == 403
    assert _refusal("127.0.0.1", forwarded_for="127.0.0.1") == 403
    with override_settings(TRUSTED_PROXIES=["127.0.0.1"]):
        assert _refusal("127.0.0.1", forwarded_for="203.0.113.9") == 403
        assert _refusal("127.0.0.1", forwarded_for="127.0.0.1") is None
        # Left of a trusted proxy's entry is what the client itself wrote.
        assert _refusal("127.0.0.1", forwarded_for="203.0.113.9, 127.0.0.1") == 403


@override_settings(METRICS_TOKEN="s3cret-token")
def test_with_a_token_set_only_the_token_opens_the_metrics():
    assert _refusal("127.0.0.1") == 401
    assert _refusal("127.0.0.1", authorization="Bearer wrong") == 401
    assert _refusal("127.0.0.1", authorization="Basic s3cret-token") == 401
    assert _refusal("203.0.113.9", authorization="Bearer s3cret-token") is None
    assert _refusal("203.0.113.9", authorization="bearer s3cret-token") is None
