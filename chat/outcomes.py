"""What conversations came to, per variant and per arm of an A/B experiment: hand-off rate, time
to the first human reply, resolution time, ratings, thumbs-down, and whether the assistant
resolved the conversation on its own.

A conversation is answered by the variant of its first answer (scheduler.models.Generation, as
the canary counts). It is **resolved by the assistant** when it ends with no hand-off, no
thumbs-down and no new conversation from the same customer within ASSISTANT_RESOLVED_WINDOW_S
(24 hours) of its last message. That is known as soon as one of those happens (not resolved),
or once the window has passed without any (resolved); until then the conversation is
undecided and counts in neither.

Intervals are 95 %: Wilson's for rates, Student's t for the mean rating. An interval is shown
only once it means something: a rate over at least MIN_FOR_RATE conversations (decided ones for
resolved-by-assistant), a mean over at least MIN_FOR_MEAN ratings; before that the console says
"not enough data yet". An arm is better than the other on a measure when both intervals are
shown and do not overlap.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Max, OuterRef, Q, Subquery
from django.utils import timezone

from chat.guests import account_client_id, guest_client_id
from chat.models import Conversation, Handoff, Message
from scheduler.models import Experiment
from scheduler.routing import ExperimentSplit

Z_95 = 1.959963984540054
MIN_FOR_RATE = 30
MIN_FOR_MEAN = 10
NO_ANSWER = ""  # the "variant" of a conversation nobody but a person answered

# Student's t at 0.975 for 1..30 degrees of freedom; above, the Cornish-Fisher expansion.
_T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_975(degrees: int) -> float:
    if degrees <= len(_T_975):
        return _T_975[degrees - 1]
    z, v = Z_95, float(degrees)
    return z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)


@dataclass(frozen=True, slots=True)
class Interval:
    value: float | None  # the rate or mean; None with no data
    low: float | None
    high: float | None
    n: int
    enough: bool  # shown, not "not enough data yet"

    def above(self, other: Interval) -> bool:
        """Both shown, and this one lies wholly above the other."""
        return (
            self.enough
            and other.enough
            and self.low is not None
            and other.high is not None
            and self.low > other.high
        )

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.n, "enough": self.enough}


def wilson(successes: int, n: int, *, minimum: int = MIN_FOR_RATE) -> Interval:
    """Wilson's score interval of a rate: sensible near 0 and 1 and for small n, unlike the
    normal approximation."""
    if n == 0:
        return Interval(None, None, None, 0, False)
    p = successes / n
    denominator = 1 + Z_95**2 / n
    centre = (p + Z_95**2 / (2 * n)) / denominator
    half = Z_95 * math.sqrt(p * (1 - p) / n + Z_95**2 / (4 * n * n)) / denominator
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half), n, n >= minimum)


def t_interval(values: list[float], *, minimum: int = MIN_FOR_MEAN) -> Interval:
    n = len(values)
    if n == 0:
        return Interval(None, None, None, 0, False)
    mean = sum(values) / n
    if n < 2:
        return Interval(mean, None, None, n, False)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_975(n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, n >= max(minimum, 2))


def percentile(values: list[float], share: float) -> float | None:
    """The nearest-rank percentile (what a customer at that rank waited)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


# --- one conversation's outcome ----------------------------------------------------------------


@dataclass(slots=True)
class ConversationOutcome:
    conversation_id: str
    customer_id: str  # the client id: "user:<pk>" or a guest's
    variant: str  # its first answer's; NO_ANSWER when none
    created_at: datetime
    last_message_at: datetime
    handed_off: bool = False
    thumbs_down: bool = False
    came_back: bool = False  # a new conversation of the customer within the window
    first_reply_s: list[float] = field(default_factory=list)
    resolution_s: list[float] = field(default_factory=list)
    ratings: list[int] = field(default_factory=list)

    def resolved_by_assistant(self, *, now: datetime, window: timedelta) -> bool | None:
        """True or False once known, None while undecided."""
        if self.handed_off or self.thumbs_down or self.came_back:
            return False
        if now - self.last_message_at >= window:
            return True
        return None


def conversation_outcomes(
    *, since: datetime, until: datetime | None = None, now: datetime | None = None
) -> list[ConversationOutcome]:
    """The outcome of every conversation started in [since, until]."""
    now = now or timezone.now()
    until = until or now
    window = timedelta(seconds=settings.ASSISTANT_RESOLVED_WINDOW_S)
    first_answer_variant = Subquery(
        Message.objects.filter(conversation=OuterRef("pk"), role=Message.Role.ASSISTANT)
        .order_by("created_at", "id")
        .values("generation__variant")[:1]
    )
    rows = (
        Conversation.objects.filter(created_at__gte=since, created_at__lte=until)
        .annotate(
            variant=first_answer_variant,
            last_message_at=Max("messages__created_at"),
            downs=Count("messages", filter=Q(messages__feedback=Message.Feedback.DOWN)),
        )
        .values("pk", "owner_id", "session_key", "created_at", "variant", "last_message_at", "downs")
    )
    outcomes: dict[str, ConversationOutcome] = {}
    for row in rows:
        customer = (
            account_client_id(row["owner_id"])
            if row["owner_id"] is not None
            else guest_client_id(row["session_key"])
        )
        outcomes[str(row["pk"])] = ConversationOutcome(
            conversation_id=str(row["pk"]),
            customer_id=customer,
            variant=row["variant"] or NO_ANSWER,
            created_at=row["created_at"],
            last_message_at=row["last_message_at"] or row["created_at"],
            thumbs_down=row["downs"] > 0,
        )
    for handoff in Handoff.objects.filter(
        conversation_id__in=[o.conversation_id for o in outcomes.values()]
    ).values("conversation_id", "requested_at", "first_reply_at", "ended_at", "outcome", "rating"):
        outcome = outcomes[str(handoff["conversation_id"])]
        outcome.handed_off = True
        if handoff["first_reply_at"] is not None:
            outcome.first_reply_s.append(
                (handoff["first_reply_at"] - handoff["requested_at"]).total_seconds()
            )
        if handoff["outcome"] == Handoff.Outcome.RESOLVED:
            outcome.resolution_s.append((handoff["ended_at"] - handoff["requested_at"]).total_seconds())
        if handoff["rating"] is not None:
            outcome.ratings.append(handoff["rating"])
    # Whether each customer came back: their conversations started up to a window after these.
    started: dict[str, list[datetime]] = defaultdict(list)
    for row in Conversation.objects.filter(created_at__gte=since, created_at__lte=until + window).values(
        "owner_id", "session_key", "created_at"
    ):
        customer = (
            account_client_id(row["owner_id"])
            if row["owner_id"] is not None
            else guest_client_id(row["session_key"])
        )
        started[customer].append(row["created_at"])
    for outcome in outcomes.values():
        outcome.came_back = any(
            outcome.last_message_at < moment <= outcome.last_message_at + window
            for moment in started[outcome.customer_id]
        )
    return list(outcomes.values())


# --- per variant, per arm ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcomes:
    """A set of conversations' outcomes (a variant's, an arm's), as the console shows them."""

    label: str
    conversations: int
    decided: int  # whose resolved-by-assistant is known
    resolved_by_assistant: Interval
    handoff_rate: Interval
    thumbs_down_rate: Interval
    rating: Interval
    first_reply_p50_s: float | None
    first_reply_p90_s: float | None
    resolution_p50_s: float | None
    resolution_p90_s: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "conversations": self.conversations,
            "decided": self.decided,
            "resolved_by_assistant": self.resolved_by_assistant.as_dict(),
            "handoff_rate": self.handoff_rate.as_dict(),
            "thumbs_down_rate": self.thumbs_down_rate.as_dict(),
            "rating": self.rating.as_dict(),
            "first_reply_p50_s": self.first_reply_p50_s,
            "first_reply_p90_s": self.first_reply_p90_s,
            "resolution_p50_s": self.resolution_p50_s,
            "resolution_p90_s": self.resolution_p90_s,
        }


def outcomes_summary(label: str, outcomes: list[ConversationOutcome], *, now: datetime) -> Outcomes:
    window = timedelta(seconds=settings.ASSISTANT_RESOLVED_WINDOW_S)
    verdicts = [o.resolved_by_assistant(now=now, window=window) for o in outcomes]
    decided = [v for v in verdicts if v is not None]
    first_replies = [s for o in outcomes for s in o.first_reply_s]
    resolutions = [s for o in outcomes for s in o.resolution_s]
    return Outcomes(
        label=label,
        conversations=len(outcomes),
        decided=len(decided),
        resolved_by_assistant=wilson(sum(decided), len(decided)),
        handoff_rate=wilson(sum(o.handed_off for o in outcomes), len(outcomes)),
        thumbs_down_rate=wilson(sum(o.thumbs_down for o in outcomes), len(outcomes)),
        rating=t_interval([float(r) for o in outcomes for r in o.ratings]),
        first_reply_p50_s=percentile(first_replies, 0.5),
        first_reply_p90_s=percentile(first_replies, 0.9),
        resolution_p50_s=percentile(resolutions, 0.5),
        resolution_p90_s=percentile(resolutions, 0.9),
    )


def outcomes_by_variant(*, since: datetime | None = None, now: datetime | None = None) -> list[Outcomes]:
    """Per variant, over the conversations started in the measures' window (HANDOFF_MEASURES_WINDOW_S)."""
    now = now or timezone.now()
    since = since or now - timedelta(seconds=settings.HANDOFF_MEASURES_WINDOW_S)
    by_variant: dict[str, list[ConversationOutcome]] = defaultdict(list)
    for outcome in conversation_outcomes(since=since, now=now):
        by_variant[outcome.variant].append(outcome)
    return [outcomes_summary(variant, rows, now=now) for variant, rows in sorted(by_variant.items())]


@dataclass(frozen=True, slots=True)
class ExperimentResults:
    experiment: Experiment
    arms: tuple[Outcomes, Outcomes]  # variant_a's, variant_b's
    # The arm that serves customers better (resolved by the assistant), once the intervals say so.
    better: str | None

    @property
    def enough(self) -> bool:
        return all(arm.resolved_by_assistant.enough for arm in self.arms)


def experiment_results(*, experiment: Experiment, now: datetime | None = None) -> ExperimentResults:
    """Each arm's outcomes: conversations its customers started while the experiment ran, but
    those the canary answered (their first answer is another variant's)."""
    now = now or timezone.now()
    split = ExperimentSplit.from_experiment(experiment)
    arms: dict[str, list[ConversationOutcome]] = {experiment.variant_a: [], experiment.variant_b: []}
    for outcome in conversation_outcomes(
        since=experiment.started_at, until=experiment.ended_at or now, now=now
    ):
        arm = split.arm_of(outcome.customer_id)
        if outcome.variant in {arm, NO_ANSWER}:
            arms[arm].append(outcome)
    a, b = (outcomes_summary(name, arms[name], now=now) for name in experiment.arms)
    better = None
    if a.resolved_by_assistant.above(b.resolved_by_assistant):
        better = experiment.variant_a
    elif b.resolved_by_assistant.above(a.resolved_by_assistant):
        better = experiment.variant_b
    return ExperimentResults(experiment, (a, b), better)
