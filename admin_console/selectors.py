"""Reads for the console: the live dashboard's numbers, the canary's comparison, the audit log."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from admin_console.models import AuditLog, CanaryRollout, QualityRun
from chat.models import Message
from knowledge.models import CachedAnswer
from knowledge.quality import VariantSettings
from scheduler import fair_share, keys, timeseries
from scheduler.autoscale import workers_desired
from scheduler.generation import Origin
from scheduler.models import CacheResult, CanaryRouting, Experiment, Generation, TierPolicy, Variant
from scheduler.queues import queue_state
from scheduler.routing import variant_models
from scheduler.warmpool import warm_spares
from scheduler.workers import WorkerInfo, live_workers

LIVE_WINDOW_S = 5 * 60
CHART_WINDOW_S = 15 * 60

# --- live dashboard -------------------------------------------------------------------------------


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


# --- canary ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VariantStats:
    """A variant's answers completed since `since`, as the canary rules compare them."""

    variant: str
    since: datetime
    answers: int  # done or failed; answers the asker stopped say nothing about the model
    errors: int
    ttft_p95_ms: float | None
    votes: int
    thumbs_down: int

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.answers if self.answers else None

    @property
    def thumbs_down_rate(self) -> float | None:
        return self.thumbs_down / self.votes if self.votes else None

    def as_record(self) -> dict:
        """The numbers, as stored with a rollback."""
        return {
            "variant": self.variant,
            "since": self.since.isoformat(),
            "answers": self.answers,
            "errors": self.errors,
            "error_rate": self.error_rate,
            "ttft_p95_ms": self.ttft_p95_ms,
            "votes": self.votes,
            "thumbs_down": self.thumbs_down,
            "thumbs_down_rate": self.thumbs_down_rate,
        }


def variant_stats(*, variant: str, since: datetime) -> VariantStats:
    """Every generation customers asked the variant for, whatever the door (chat, API, batch);
    votes come from chat answers. TTFT is read as the dashboard reads it: every answer that
    wrote a token, through the same bins and percentile. Answers served from the result cache
    are left out: the variant's model did not write them then, and their TTFT is a lookup's.
    So are the quality score's questions: staff's test, asked all at once, whose burst would
    weigh on the TTFT rule as if customers had waited."""
    ended = (
        Generation.objects.filter(variant=variant, finished_at__gte=since)
        .exclude(cache__in=[CacheResult.EXACT, CacheResult.SEMANTIC, CacheResult.PINNED])
        .exclude(origin=Origin.QUALITY)
    )
    counts = ended.filter(status__in=[Generation.Status.DONE, Generation.Status.ERROR]).aggregate(
        answers=Count("pk"),
        errors=Count("pk", filter=Q(status=Generation.Status.ERROR)),
        votes=Count("message__feedback"),
        thumbs_down=Count("pk", filter=Q(message__feedback=Message.Feedback.DOWN)),
    )
    ttfts = ended.filter(ttft_ms__isnull=False).values_list("ttft_ms", flat=True)
    ttft_p95 = timeseries.latency_percentile(timeseries.latency_bins(ttfts), 0.95)
    return VariantStats(variant=variant, since=since, ttft_p95_ms=_rounded(ttft_p95), **counts)


def canary_comparison(
    *, rollout: CanaryRollout, now: datetime | None = None
) -> tuple[VariantStats, VariantStats]:
    """(stable, candidate) over the rollout's window.

    The candidate counts only since the rollout began. Stable counts over the same window
    while it has enough answers; at high splits it has few, so its baseline then reaches back
    to one window before the rollout began.
    """
    now = now or timezone.now()
    window = timedelta(seconds=rollout.window_s)
    candidate = variant_stats(variant=rollout.candidate_variant, since=max(now - window, rollout.started_at))
    stable = variant_stats(variant=rollout.stable_variant, since=now - window)
    if stable.answers < rollout.min_answers or stable.votes < rollout.min_votes:
        stable = variant_stats(variant=rollout.stable_variant, since=rollout.started_at - window)
    return stable, candidate


@dataclass(frozen=True, slots=True)
class RuleCheck:
    rule: str  # "error_rate" | "ttft_p95" | "thumbs_down"
    label: str
    stable: float | None
    candidate: float | None
    limit: str  # how the rule reads, e.g. "+5 points"
    state: str  # "ok" | "breached" | "waiting" (not enough answers or votes yet)

    @property
    def breached(self) -> bool:
        return self.state == "breached"


def rule_checks(*, rollout: CanaryRollout, stable: VariantStats, candidate: VariantStats) -> list[RuleCheck]:
    answers_enough = min(stable.answers, candidate.answers) >= rollout.min_answers
    votes_enough = min(stable.votes, candidate.votes) >= rollout.min_votes

    def state(enough: bool, breached: bool) -> str:
        return "waiting" if not enough else ("breached" if breached else "ok")

    error_gap = None
    if stable.error_rate is not None and candidate.error_rate is not None:
        error_gap = (candidate.error_rate - stable.error_rate) * 100
    down_gap = None
    if stable.thumbs_down_rate is not None and candidate.thumbs_down_rate is not None:
        down_gap = (candidate.thumbs_down_rate - stable.thumbs_down_rate) * 100
    ttft_known = stable.ttft_p95_ms is not None and candidate.ttft_p95_ms is not None
    return [
        RuleCheck(
            rule="error_rate",
            label="Error rate",
            stable=stable.error_rate,
            candidate=candidate.error_rate,
            limit=f"candidate at most +{rollout.max_error_rate_increase_points:g} points",
            state=state(
                answers_enough and error_gap is not None,
                error_gap is not None and error_gap > rollout.max_error_rate_increase_points,
            ),
        ),
        RuleCheck(
            rule="ttft_p95",
            label="Time to first token, p95 (ms)",
            stable=stable.ttft_p95_ms,
            candidate=candidate.ttft_p95_ms,
            limit=f"candidate at most {rollout.max_ttft_p95_ratio:g} times stable",
            state=state(
                answers_enough and ttft_known,
                ttft_known and candidate.ttft_p95_ms > rollout.max_ttft_p95_ratio * stable.ttft_p95_ms,
            ),
        ),
        RuleCheck(
            rule="thumbs_down",
            label="Thumbs-down share of votes",
            stable=stable.thumbs_down_rate,
            candidate=candidate.thumbs_down_rate,
            limit=f"candidate at most +{rollout.max_thumbs_down_increase_points:g} points",
            state=state(
                votes_enough and down_gap is not None,
                down_gap is not None and down_gap > rollout.max_thumbs_down_increase_points,
            ),
        ),
    ]


def running_rollout() -> CanaryRollout | None:
    return CanaryRollout.objects.filter(status=CanaryRollout.Status.RUNNING).first()


@dataclass(frozen=True, slots=True)
class CanaryOverview:
    routing: CanaryRouting
    rollout: CanaryRollout | None  # the running one
    last_rollout: CanaryRollout | None  # the latest one, running or ended
    stable: VariantStats | None
    candidate: VariantStats | None
    checks: list[RuleCheck]
    next_percent: int | None
    next_step_at: datetime | None
    workers_by_variant: dict[str, int]
    quality: dict[str, VariantQuality]  # stable's, the candidate's and live candidates', by name
    quality_gate: QualityGate | None  # while a canary runs

    @property
    def quality_running(self) -> bool:
        return any(row.running is not None for row in self.quality.values())


def canary_overview() -> CanaryOverview:
    routing = CanaryRouting.load()
    rollout = running_rollout()
    workers = Counter(w.model for w in live_workers() if not w.state.get("draining"))
    model_of = dict(Variant.objects.values_list("name", "model"))
    stable = candidate = None
    checks: list[RuleCheck] = []
    next_percent = next_step_at = None
    gate = None
    if rollout is not None:
        gate = quality_gate(
            stable_variant=rollout.stable_variant, candidate_variant=rollout.candidate_variant
        )
        stable, candidate = canary_comparison(rollout=rollout)
        checks = rule_checks(rollout=rollout, stable=stable, candidate=candidate)
        next_percent = rollout.next_percent(routing.split_percent)
        next_step_at = rollout.step_started_at + timedelta(seconds=rollout.hold_s(routing.split_percent))
    return CanaryOverview(
        routing=routing,
        rollout=rollout,
        last_rollout=CanaryRollout.objects.first(),
        stable=stable,
        candidate=candidate,
        checks=checks,
        next_percent=next_percent,
        next_step_at=next_step_at,
        workers_by_variant={name: workers[model] for name, model in sorted(model_of.items())},
        quality={
            variant: variant_quality(variant=variant)
            for variant in dict.fromkeys(
                [routing.stable_variant, routing.candidate_variant, *canary_candidates()]
            )
            if variant
        },
        quality_gate=gate,
    )


@dataclass(frozen=True, slots=True)
class CacheFigures:
    """The result cache over the live window, from the generation records (every web process)."""

    lookups: int
    hits: dict[str, int]  # exact, semantic, pinned
    hit_rate: float | None  # 0..1; None without lookups
    saved_engine_s: float
    lookup_p50_ms: float | None
    lookup_p95_ms: float | None


def _percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))], 2)


def cache_figures(*, window_s: float = LIVE_WINDOW_S) -> CacheFigures:
    since = timezone.now() - timedelta(seconds=window_s)
    looked_up = Generation.objects.filter(created_at__gte=since).exclude(cache="")
    rows = list(looked_up.values_list("cache", "cache_lookup_ms", "saved_engine_ms"))
    hits = Counter(result for result, _, _ in rows if result != CacheResult.MISS.value)
    return CacheFigures(
        lookups=len(rows),
        hits={
            result: hits[result] for result in (CacheResult.EXACT, CacheResult.SEMANTIC, CacheResult.PINNED)
        },
        hit_rate=round(hits.total() / len(rows), 3) if rows else None,
        saved_engine_s=round(sum(saved or 0.0 for _, _, saved in rows) / 1000, 1),
        lookup_p50_ms=_percentile([ms for _, ms, _ in rows if ms is not None], 0.5),
        lookup_p95_ms=_percentile([ms for _, ms, _ in rows if ms is not None], 0.95),
    )


def pinned_answers() -> QuerySet[CachedAnswer]:
    return CachedAnswer.objects.exclude(pinned_answer="").order_by("variant", "question")


@dataclass(frozen=True, slots=True)
class VariantGrounding:
    """What the chat's answers of one variant were checked for over a recent window."""

    answers: int
    declined: int  # the honest decline (the help center does not answer)
    checked: int  # sentences checked (a verified answer's) or quoted (an extractive one's)
    replaced: int  # a verified answer's sentences that failed and were replaced by the help center's
    dropped: int  # ... and left out
    corrected_answers: int  # verified answers with a sentence replaced or left out

    @property
    def declined_share(self) -> float:
        return self.declined / self.answers if self.answers else 0.0


GROUNDING_WINDOW = timedelta(hours=1)


def grounding_by_variant(*, window: timedelta = GROUNDING_WINDOW) -> dict[str, VariantGrounding]:
    """Per variant, the chat answers finished within `window` and what their check found
    (Generation.grounding, scheduler.generation.GroundingReport)."""
    rows = Generation.objects.filter(
        origin=Origin.CHAT, finished_at__gte=timezone.now() - window, grounding__isnull=False
    ).values_list("variant", "grounding")
    totals: dict[str, Counter[str]] = {}
    for variant, report in rows.iterator(chunk_size=2000):
        total = totals.setdefault(variant, Counter())
        total["answers"] += 1
        total["declined"] += bool(report.get("declined"))
        for part in ("checked", "replaced", "dropped"):
            total[part] += int(report.get(part, 0))
        total["corrected_answers"] += bool(report.get("replaced") or report.get("dropped"))
    return {
        variant: VariantGrounding(**{field: total[field] for field in VariantGrounding.__slots__})
        for variant, total in totals.items()
    }


def variants() -> QuerySet[Variant]:
    return Variant.objects.order_by("name")


def canary_candidates() -> list[str]:
    """Variants a canary may try: those whose model live, undrained workers serve, other than
    stable."""
    stable = CanaryRouting.load().stable_variant
    served = {w.model for w in live_workers() if not w.state.get("draining")}
    return list(Variant.objects.filter(model__in=served).exclude(name=stable).values_list("name", flat=True))


def automatic_rollback_alert() -> CanaryRollout | None:
    """The latest canary, when the evaluation rolled it back (until the next one starts)."""
    last = CanaryRollout.objects.first()
    if last is not None and last.status == CanaryRollout.Status.ROLLED_BACK and last.automatic:
        return last
    return None


# --- rate limits and audit ------------------------------------------------------------------------


def tier_policies() -> list[TierPolicy]:
    order = {tier: index for index, tier in enumerate(keys.TIERS)}
    return sorted(TierPolicy.objects.all(), key=lambda policy: order.get(policy.tier, len(order)))


def source_weights() -> dict[str, float]:
    """The fair share's weight of each origin (1 when never set), in the origins' order."""
    return fair_share.weights_stored()


def audit_entries(*, limit: int = 200) -> QuerySet[AuditLog]:
    return AuditLog.objects.select_related("actor")[:limit]


# --- quality scores --------------------------------------------------------------------------------


def quality_run_running(*, variant: str) -> QualityRun | None:
    """The variant's score being run now; one older than QUALITY_RUN_TIMEOUT_S lost its task."""
    since = timezone.now() - timedelta(seconds=settings.QUALITY_RUN_TIMEOUT_S)
    return (
        QualityRun.objects.filter(variant=variant, status=QualityRun.Status.RUNNING, started_at__gte=since)
        .order_by("-started_at", "-id")
        .first()
    )


def quality_latest_by_variant() -> dict[str, QualityRun]:
    """Every variant's latest finished score, by name, in one query."""
    latest: dict[str, QualityRun] = {}
    for run in QualityRun.objects.filter(status=QualityRun.Status.DONE).order_by("-finished_at", "-id"):
        latest.setdefault(run.variant, run)
    return latest


def quality_run_latest(*, variant: str) -> QualityRun | None:
    """The variant's latest finished score."""
    return (
        QualityRun.objects.filter(variant=variant, status=QualityRun.Status.DONE)
        .order_by("-finished_at", "-id")
        .first()
    )


@dataclass(frozen=True, slots=True)
class VariantQuality:
    variant: str
    latest: QualityRun | None  # the latest finished score
    running: QualityRun | None
    last_failed: QualityRun | None  # the latest run, when it failed


def variant_quality(*, variant: str) -> VariantQuality:
    last = QualityRun.objects.filter(variant=variant).order_by("-started_at", "-id").first()
    return VariantQuality(
        variant=variant,
        latest=quality_run_latest(variant=variant),
        running=quality_run_running(variant=variant),
        last_failed=last if last is not None and last.status == QualityRun.Status.FAILED else None,
    )


@dataclass(frozen=True, slots=True)
class QualityGate:
    passed: bool
    reason: str  # why not, in the words the console shows; "" when passed


def _scored_as_it_is(name: str, run: QualityRun) -> bool:
    """Whether the score was asked with the variant's settings as they are now."""
    variant = Variant.objects.filter(name=name).first()
    return variant is not None and run.variant_settings == VariantSettings.of(variant).as_dict()


def quality_gate(*, stable_variant: str, candidate_variant: str) -> QualityGate:
    """A candidate may become stable only when its latest quality score, asked with its
    settings as they are now, is at least stable's (likewise scored)."""
    stable = quality_run_latest(variant=stable_variant)
    candidate = quality_run_latest(variant=candidate_variant)
    missing = [
        name for name, run in ((stable_variant, stable), (candidate_variant, candidate)) if run is None
    ]
    if missing:
        return QualityGate(
            False,
            f"Not promoted: {' and '.join(missing)} {'has' if len(missing) == 1 else 'have'} no quality "
            "score yet. Run it from the canary page first.",
        )
    assert stable is not None and candidate is not None and stable.overall is not None
    assert candidate.overall is not None
    changed = [
        name
        for name, run in ((stable_variant, stable), (candidate_variant, candidate))
        if not _scored_as_it_is(name, run)
    ]
    if changed:
        return QualityGate(
            False,
            f"Not promoted: {' and '.join(changed)} changed since {'its' if len(changed) == 1 else 'their'} "
            "last quality score. Score it again from the canary page first.",
        )
    if candidate.overall < stable.overall:
        return QualityGate(
            False,
            f"Not promoted: {candidate_variant}'s quality score ({candidate.overall:.3f}) is below "
            f"{stable_variant}'s ({stable.overall:.3f}).",
        )
    return QualityGate(True, "")


# --- A/B experiments ------------------------------------------------------------------------------


def experiment_running() -> Experiment | None:
    return Experiment.objects.filter(status=Experiment.Status.RUNNING).first()


def experiments_ended(*, limit: int = 10) -> QuerySet[Experiment]:
    return Experiment.objects.filter(status=Experiment.Status.ENDED)[:limit]
