"""Reads of the canary page: each variant's numbers, the rules' checks, the running rollout and
the banner of an automatic rollback every console page shows.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Q
from django.utils import timezone

from admin_console.models import CanaryRollout
from admin_console.selectors.dashboard import _rounded
from admin_console.selectors.quality import QualityGate, VariantQuality, quality_gate, variant_quality
from chat.models import Message
from scheduler import timeseries
from scheduler.generation import Origin
from scheduler.models import CacheResult, CanaryRouting, Generation, Variant
from scheduler.workers import live_workers


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
