"""Reads of the live dashboard: queues, the fleet, workers, latency and refusals."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass

from scheduler import keys, timeseries
from scheduler.autoscale import workers_desired
from scheduler.models import CanaryRouting
from scheduler.queues import queue_state
from scheduler.routing import variant_models
from scheduler.warmpool import warm_spares
from scheduler.workers import WorkerInfo, live_workers

LIVE_WINDOW_S = 5 * 60
CHART_WINDOW_S = 15 * 60


@dataclass(frozen=True, slots=True)
class QueueRow:
    model: str
    tier: str
    queued: int
    predicted_wait_s: float
    drain_rate_per_s: float


@dataclass(frozen=True, slots=True)
class WorkerRow:
    worker_id: str
    model: str
    engine: str
    simulated: bool
    running: int
    slots: int
    paused: int  # answers paused for a VIP one, to resume where they were
    vip_waiting: bool  # a VIP job claimed, waiting for a slot to turn over or be freed for it
    kv_cache_usage: float | None  # 0..1
    # Share of prompt tokens found in the engine's prefix cache since it started; None: no lookups.
    prefix_cache_hit_rate: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    on_gpu: bool  # else the memory shown is the engine process's resident memory
    heartbeat_age_s: float
    draining: bool
    spare: bool  # warm: engine loaded, claiming nothing until its model needs it

    @classmethod
    def from_info(cls, info: WorkerInfo, *, now: float) -> WorkerRow:
        state = info.state
        return cls(
            worker_id=info.worker_id,
            model=info.model,
            engine=info.engine,
            simulated=info.engine.startswith("simulated"),
            running=info.running,
            slots=info.slots,
            paused=state.get("paused", 0),
            vip_waiting=bool(state.get("vip_waiting")),
            kv_cache_usage=state.get("kv_cache_usage"),
            prefix_cache_hit_rate=(
                state["prefix_cache_hits"] / state["prefix_cache_queries"]
                if state.get("prefix_cache_queries")
                else None
            ),
            memory_used_bytes=state.get("memory_used_bytes"),
            memory_total_bytes=state.get("memory_total_bytes"),
            on_gpu=state.get("memory_source") == "cuda",
            heartbeat_age_s=max(0.0, now - info.last_seen),
            draining=bool(state.get("draining")),
            spare=bool(state.get("spare")),
        )


@dataclass(frozen=True, slots=True)
class FleetRow:
    """A model's workers: how many are live, how many the autoscaling signal asks for."""

    model: str
    live: int
    desired: int


@dataclass(frozen=True, slots=True)
class Dashboard:
    queues: list[QueueRow]
    queued_total: int
    longest_wait_s: float
    fleet: list[FleetRow]
    warm_spares: int  # per model, set in the console
    workers: list[WorkerRow]
    running_total: int
    slots_total: int
    answers: int  # finished in the live window
    tokens_per_s: float
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    itl_p50_ms: float | None
    itl_p95_ms: float | None
    refusals_per_min: list[tuple[str, float]]  # by reason, most first
    refusals_per_min_total: float
    charts: dict  # JSON for console.js: 15 minutes of queue depth, TTFT p95 and tokens/s


def _models(workers: list[WorkerInfo]) -> list[str]:
    """The models live workers serve, and those the routed variants need."""
    routing = CanaryRouting.load()
    routed = [routing.stable_variant, *([routing.candidate_variant] if routing.candidate_variant else [])]
    return sorted({w.model for w in workers} | variant_models(routed))


def _charts(buckets: list[timeseries.SeriesBucket]) -> dict:
    def depth(bucket: timeseries.SeriesBucket, tier: str) -> int | None:
        samples = [n for (_, t), n in bucket.queue_depth.items() if t == tier]
        return sum(samples) if samples else None

    def ttft_p95(bucket: timeseries.SeriesBucket) -> float | None:
        value = timeseries.latency_percentile(bucket.ttft_bins, 0.95)
        return None if value is None else round(value, 1)

    return {
        "bucket_s": timeseries.BUCKET_S,
        "starts": [b.start for b in buckets],
        "queue_depth": {tier: [depth(b, tier) for b in buckets] for tier in keys.TIERS},
        "ttft_p95_ms": [ttft_p95(b) for b in buckets],
        "tokens_per_s": [round(b.output_tokens / timeseries.BUCKET_S, 1) for b in buckets],
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def dashboard() -> Dashboard:
    now = time.time()
    infos = live_workers()
    models = _models(infos)
    queues = [
        QueueRow(model=model, tier=tier, **asdict(queue_state(model=model, tier=tier)))
        for model in models
        for tier in keys.TIERS
    ]
    fleet = [
        FleetRow(
            model=model,
            live=sum(1 for info in infos if info.model == model),
            desired=workers_desired(
                model=model,
                workers=infos,
                queued={q.tier: q.queued for q in queues if q.model == model},
            ),
        )
        for model in models
    ]
    buckets = timeseries.series_buckets(seconds=CHART_WINDOW_S + timeseries.BUCKET_S, now=now)
    live = [b for b in buckets if b.start > now - LIVE_WINDOW_S - timeseries.BUCKET_S]
    live_s = max(1.0, now - live[0].start)
    ttft = timeseries.merged_bins(b.ttft_bins for b in live)
    itl = timeseries.merged_bins(b.itl_bins for b in live)
    refusals: Counter[str] = Counter()
    for bucket in live:
        refusals.update(bucket.refusals)
    workers = [WorkerRow.from_info(info, now=now) for info in infos]
    return Dashboard(
        queues=queues,
        queued_total=sum(q.queued for q in queues),
        longest_wait_s=max((q.predicted_wait_s for q in queues if q.queued), default=0.0),
        fleet=fleet,
        warm_spares=warm_spares(),
        workers=workers,
        running_total=sum(w.running for w in workers),
        slots_total=sum(w.slots for w in workers),
        answers=sum(sum(b.answers.values()) for b in live),
        tokens_per_s=round(sum(b.output_tokens for b in live) / live_s, 1),
        ttft_p50_ms=_rounded(timeseries.latency_percentile(ttft, 0.5)),
        ttft_p95_ms=_rounded(timeseries.latency_percentile(ttft, 0.95)),
        itl_p50_ms=_rounded(timeseries.latency_percentile(itl, 0.5)),
        itl_p95_ms=_rounded(timeseries.latency_percentile(itl, 0.95)),
        refusals_per_min=[(reason, round(n * 60 / live_s, 1)) for reason, n in refusals.most_common()],
        refusals_per_min_total=round(sum(refusals.values()) * 60 / live_s, 1),
        # The current bucket is still filling: charts end with the last complete one.
        charts=_charts(buckets[:-1]),
    )
