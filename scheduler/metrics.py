"""Prometheus objects of the traffic layer, and who may read them.

A web process serves two registries at /metrics: prometheus_client's default one (process_*
and python_* of that process) and WEB_REGISTRY: its admission decisions and followed streams,
plus the fleet read from Redis at scrape time (queues, live workers and their engines, the
canary split), so that scraping any one web process shows the whole fleet. The objects here
live in WEB_REGISTRY so that an inference worker, which imports this app too, does not export
them from its own endpoint.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterator
from http import HTTPStatus

import redis
from django.conf import settings
from django.db import DatabaseError
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from scheduler import keys
from scheduler.autoscale import workers_desired
from scheduler.networks import address_in, forwarded_client, proxy_trusted
from scheduler.policy import tier_policy
from scheduler.queues import queue_state
from scheduler.routing import canary_split, variant_models
from scheduler.warmpool import warm_spares
from scheduler.workers import WorkerInfo, live_workers

logger = logging.getLogger(__name__)

WEB_REGISTRY = CollectorRegistry()

ADMISSIONS = Counter(
    "llm_admissions_total",
    "Admission decisions by tier: outcome admitted, rate_limited (429), overloaded (503: queue "
    "full or predicted wait over the SLO) or unavailable (503: Redis unreachable); reason is the "
    "refusal's code, empty when admitted.",
    ["tier", "outcome", "reason"],
    registry=WEB_REGISTRY,
)
STREAM_CLIENTS = Gauge(
    "llm_stream_clients",
    "Clients (SSE and streaming API) this web process is relaying a request's result stream to.",
    registry=WEB_REGISTRY,
)


def admission_record(*, tier: str, status: int | None = None, reason: str = "") -> None:
    """Count one admission decision; `status` is the refusal's HTTP status, None when admitted."""
    if status is None:
        outcome = "admitted"
    elif status == HTTPStatus.TOO_MANY_REQUESTS:
        outcome = "rate_limited"
    elif reason == "scheduler_unavailable":
        outcome = "unavailable"
    else:
        outcome = "overloaded"
    ADMISSIONS.labels(tier, outcome, reason).inc()


class FleetCollector(Collector):
    """The fleet as Redis holds it, read at each scrape. With several web processes every one
    exports the same fleet series (told apart by `instance`): aggregate them with max, not sum."""

    def collect(self) -> Iterator[Metric]:
        redis_up = GaugeMetricFamily(
            "llm_scheduler_redis_up",
            "1 when this scrape could read the scheduler's state from Redis; at 0 the fleet "
            "metrics (queues, workers, canary) are missing from the scrape.",
        )
        try:
            fleet = list(_fleet_metrics())
        except (redis.RedisError, DatabaseError) as exc:
            logger.warning("metrics: could not read the fleet's state (%s)", exc)
            redis_up.add_metric([], 0)
            yield redis_up
            return
        redis_up.add_metric([], 1)
        yield redis_up
        yield from fleet


def _fleet_metrics() -> Iterator[Metric]:
    split = canary_split()
    workers = live_workers()
    # Every model that traffic can reach gets its series, with zeros when nobody serves it:
    # a canary candidate whose model has no live worker is exactly what the alerts must see.
    routed = [split.stable_variant]
    if split.candidate_variant and split.split_percent > 0:
        routed.append(split.candidate_variant)
    models = {*variant_models(routed), *(worker.model for worker in workers)}

    canary = GaugeMetricFamily(
        "llm_canary_split_percent",
        "Share of new conversations routed to the canary candidate variant (0 after a rollback).",
        labels=["stable", "candidate"],
    )
    canary.add_metric([split.stable_variant, split.candidate_variant], split.split_percent)
    yield canary

    depth = GaugeMetricFamily(
        "llm_queue_depth",
        "Jobs waiting in the queue, not yet claimed by a worker.",
        labels=["model", "tier"],
    )
    wait = GaugeMetricFamily(
        "llm_queue_predicted_wait_seconds",
        "Predicted wait of a job enqueued now (jobs ahead of it over the drain rate); admission "
        "refuses a job whose predicted wait is over its tier's SLO.",
        labels=["model", "tier"],
    )
    drain = GaugeMetricFamily(
        "llm_queue_drain_rate_jobs_per_second",
        "Jobs per second the live workers can take from the tier (their slots over their mean "
        "service time; a floor while none reports).",
        labels=["model", "tier"],
    )
    queued: dict[str, dict[str, int]] = {}
    for model in sorted(models):
        for tier in keys.TIERS:
            state = queue_state(model=model, tier=tier)
            queued.setdefault(model, {})[tier] = state.queued
            depth.add_metric([model, tier], state.queued)
            wait.add_metric([model, tier], state.predicted_wait_s)
            drain.add_metric([model, tier], state.drain_rate_per_s)
    slo = GaugeMetricFamily(
        "llm_queue_wait_slo_seconds",
        "Longest predicted wait admission still admits (the tier's policy, edited in the console).",
        labels=["tier"],
    )
    for tier in keys.TIERS:
        slo.add_metric([tier], tier_policy(tier).wait_slo_s)
    yield from (depth, wait, drain, slo)

    live = GaugeMetricFamily(
        "llm_workers_live", "Inference workers with a fresh heartbeat.", labels=["model"]
    )
    desired = GaugeMetricFamily(
        "llm_workers_desired",
        "Inference workers the model needs now: admitted arrivals plus the queue cleared within "
        "each tier's wait SLO, over what a worker finishes per second (slots outside the VIP "
        "reserve for normal and batch), at AUTOSCALE_TARGET_UTILIZATION. KEDA scales on it.",
        labels=["model"],
    )
    spare = GaugeMetricFamily(
        "llm_workers_spare",
        "Live workers waiting as warm spares: engine loaded, claiming nothing until needed.",
        labels=["model"],
    )
    for model in sorted(models):
        live.add_metric([model], sum(1 for worker in workers if worker.model == model))
        spare.add_metric([model], sum(1 for w in workers if w.model == model and w.state.get("spare")))
        desired.add_metric([model], workers_desired(model=model, workers=workers, queued=queued[model]))
    spares_wanted = GaugeMetricFamily(
        "llm_workers_warm_spares",
        "Warm spares each model keeps beyond llm_workers_desired (set in the console); KEDA scales to both.",
    )
    spares_wanted.add_metric([], warm_spares())
    yield from (live, spare, desired, spares_wanted)
    yield from _worker_metrics(workers)


def _worker_metrics(workers: list[WorkerInfo]) -> Iterator[Metric]:
    """Each live worker's last heartbeat: what it runs, and its engine's cache and memory."""
    labels = ["worker", "model", "engine"]

    def family(name: str, documentation: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, documentation, labels=[*labels, *extra])

    running = family("llm_worker_running_sequences", "Answers the worker is generating now.")
    slots = family("llm_worker_sequence_slots", "Answers the worker may generate at once (max_num_seqs).")
    waiting = family("llm_worker_engine_waiting_sequences", "Requests waiting inside the engine.")
    kv_cache = family("llm_worker_kv_cache_usage_ratio", "Share of the engine's KV cache in use (0..1).")
    draining = family("llm_worker_draining", "1 while the worker finishes its answers and claims no more.")
    memory_used = family(
        "llm_worker_memory_used_bytes",
        "Memory the engine uses: GPU memory (source=cuda) or, without a GPU, the worker "
        "process's resident memory (source=process-rss).",
        ("source",),
    )
    memory_total = family(
        "llm_worker_memory_total_bytes",
        "Memory available to the engine: the GPU's (source=cuda) or the machine's (process-rss).",
        ("source",),
    )
    prefix_queries = CounterMetricFamily(
        "llm_worker_prefix_cache_queries",
        "Prompt tokens the engine looked up in its prefix cache since it started (vLLM's count).",
        labels=labels,
    )
    prefix_hits = CounterMetricFamily(
        "llm_worker_prefix_cache_hits",
        "Prompt tokens the engine found in its prefix cache since it started (vLLM's count).",
        labels=labels,
    )
    for worker in workers:
        values = [worker.worker_id, worker.model, worker.engine]
        prefix_queries.add_metric(values, worker.state.get("prefix_cache_queries", 0))
        prefix_hits.add_metric(values, worker.state.get("prefix_cache_hits", 0))
        running.add_metric(values, worker.running)
        slots.add_metric(values, worker.slots)
        # .get: a worker of an older release, still heartbeating during a rollout, may lack these.
        waiting.add_metric(values, worker.state.get("engine_waiting", 0))
        kv_cache.add_metric(values, worker.state.get("kv_cache_usage", 0.0))
        draining.add_metric(values, 1 if worker.state.get("draining") else 0)
        source = worker.state.get("memory_source", "unknown")
        memory_used.add_metric([*values, source], worker.state.get("memory_used_bytes", 0))
        memory_total.add_metric([*values, source], worker.state.get("memory_total_bytes", 0))
    yield from (
        running,
        slots,
        waiting,
        kv_cache,
        draining,
        memory_used,
        memory_total,
        prefix_queries,
        prefix_hits,
    )


WEB_REGISTRY.register(FleetCollector())


def web_exposition() -> bytes:
    """The text a web process's /metrics serves: this process, then the fleet."""
    return generate_latest(REGISTRY) + generate_latest(WEB_REGISTRY)


# --- who may scrape ---------------------------------------------------------------------------


def scrape_refusal(
    *, authorization: str | None, peer_address: str, forwarded_for: str | None
) -> HTTPStatus | None:
    """None when this scraper may read metrics, else the status to refuse it with.

    With METRICS_TOKEN set, only `Authorization: Bearer <token>` counts (401 otherwise).
    Without one, the scraper's address must be in METRICS_ALLOWED_NETWORKS (403 otherwise).
    A request forwarded by a proxy (`forwarded_for`) is judged by the address the proxy saw
    when the proxy is in TRUSTED_PROXIES, and refused when it is not: a proxy on this host
    would otherwise make every client on the internet look like loopback.
    """
    token = settings.METRICS_TOKEN
    if token:
        scheme, _, presented = (authorization or "").partition(" ")
        valid = scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), token.encode())
        return None if valid else HTTPStatus.UNAUTHORIZED
    address: str | None = peer_address
    if forwarded_for is not None:
        address = forwarded_client(forwarded_for) if proxy_trusted(peer_address) else None
    return None if address_in(address, "METRICS_ALLOWED_NETWORKS") else HTTPStatus.FORBIDDEN
