"""Writes of the canary page: starting a canary, moving its split, promoting or rolling back the
candidate by hand, and the periodic evaluation that does so on its own.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from accounts.models import User
from admin_console.models import AuditLog, CanaryRollout
from admin_console.selectors import canary as canary_selectors
from admin_console.selectors import quality as quality_selectors
from admin_console.services.audit import ConsoleError, _audit
from scheduler.models import CanaryRouting, Variant
from scheduler.routing import canary_mirror
from scheduler.workers import live_workers

CANARY_RULE_FIELDS = (
    "max_error_rate_increase_points",
    "max_ttft_p95_ratio",
    "max_thumbs_down_increase_points",
    "min_answers",
    "min_votes",
    "window_s",
)


def _routing_locked() -> CanaryRouting:
    return CanaryRouting.objects.select_for_update().get(pk=CanaryRouting.load().pk)


def _routing_values(routing: CanaryRouting) -> dict[str, Any]:
    return {
        "stable_variant": routing.stable_variant,
        "candidate_variant": routing.candidate_variant,
        "split_percent": routing.split_percent,
    }


def _running_locked() -> CanaryRollout:
    rollout = CanaryRollout.objects.select_for_update().filter(status=CanaryRollout.Status.RUNNING).first()
    if rollout is None:
        raise ConsoleError("No canary is running.")
    return rollout


def canary_start(
    *, actor: User, candidate_variant: str, steps: list[dict[str, int]], rules: dict[str, Any]
) -> CanaryRollout:
    """Start sending the plan's first share of new conversations to `candidate_variant`.

    Raises ConsoleError (a canary runs already, no live worker serves the candidate's model) or
    ValidationError (the plan or rules).
    """
    serving = {w.model for w in live_workers() if not w.state.get("draining")}
    with transaction.atomic():
        routing = _routing_locked()
        if canary_selectors.running_rollout() is not None:
            raise ConsoleError("A canary is already running: promote it or roll it back first.")
        if candidate_variant == routing.stable_variant:
            raise ConsoleError(f"{candidate_variant} is the stable variant already.")
        candidate = Variant.objects.filter(name=candidate_variant).first()
        if candidate is None:
            raise ConsoleError(f"There is no variant {candidate_variant!r}.")
        if candidate.model not in serving:
            raise ConsoleError(
                f"No live worker serves {candidate.model!r}, the model of {candidate_variant!r}: "
                f"start one with INFERENCE_MODEL_NAME={candidate.model} first."
            )
        before = _routing_values(routing)
        rollout = CanaryRollout(
            stable_variant=routing.stable_variant,
            candidate_variant=candidate_variant,
            steps=steps,
            step_started_at=timezone.now(),
            started_by=actor,
            **{name: rules[name] for name in CANARY_RULE_FIELDS if name in rules},
        )
        rollout.full_clean()
        rollout.save()
        routing.candidate_variant = candidate_variant
        routing.split_percent = steps[0]["percent"]
        # A new salt: each canary tries a different share of conversations.
        routing.salt = secrets.token_hex(8)
        routing.save()
        plan = {"steps": steps, **{name: getattr(rollout, name) for name in CANARY_RULE_FIELDS}}
        _audit(
            actor=actor,
            action=AuditLog.Action.CANARY_START,
            target=candidate_variant,
            before=before,
            after={**_routing_values(routing), **plan},
        )
    canary_mirror()
    return rollout


def canary_split_set(*, actor: User, percent: int) -> CanaryRouting:
    """Move the running canary's split by hand. The plan carries on from the new split after
    its hold (a split of 0 keeps the candidate idle until changed again)."""
    if not 0 <= percent <= 100:
        raise ConsoleError("The split is a percentage from 0 to 100.")
    with transaction.atomic():
        rollout = _running_locked()
        routing = _routing_locked()
        before = _routing_values(routing)
        _split_move(rollout, routing, percent, at=timezone.now())
        _audit(
            actor=actor,
            action=AuditLog.Action.CANARY_SPLIT,
            target=rollout.candidate_variant,
            before=before,
            after=_routing_values(routing),
        )
    canary_mirror()
    return routing


def _split_move(rollout: CanaryRollout, routing: CanaryRouting, percent: int, *, at: datetime) -> None:
    routing.split_percent = percent
    routing.save(update_fields=["split_percent", "updated_at"])
    rollout.step_started_at = at
    rollout.save(update_fields=["step_started_at"])


def canary_promote(*, actor: User | None) -> CanaryRollout:
    """Make the candidate the stable variant for every new conversation; the canary ends."""
    with transaction.atomic():
        rollout = _running_locked()
        gate = quality_selectors.quality_gate(
            stable_variant=rollout.stable_variant, candidate_variant=rollout.candidate_variant
        )
        if not gate.passed:
            raise ConsoleError(gate.reason)
        _promote(rollout, _routing_locked(), actor=actor)
    canary_mirror()
    return rollout


def _promote(rollout: CanaryRollout, routing: CanaryRouting, *, actor: User | None) -> None:
    before = _routing_values(routing)
    routing.stable_variant = rollout.candidate_variant
    routing.candidate_variant = ""
    routing.split_percent = 0
    routing.save()
    rollout.status = CanaryRollout.Status.PROMOTED
    rollout.ended_at = timezone.now()
    rollout.automatic = actor is None
    rollout.save()
    _audit(
        actor=actor,
        action=AuditLog.Action.CANARY_PROMOTE,
        target=rollout.candidate_variant,
        before=before,
        after=_routing_values(routing),
    )


def canary_rollback(*, actor: User) -> CanaryRollout:
    """Send every new conversation back to stable at once; the canary ends."""
    with transaction.atomic():
        rollout = _running_locked()
        routing = _routing_locked()
        numbers = _comparison_record(rollout, routing, now=timezone.now())
        _rollback(rollout, routing, actor=actor, reason="manual", numbers=numbers)
    canary_mirror()
    return rollout


def _rollback(
    rollout: CanaryRollout,
    routing: CanaryRouting,
    *,
    actor: User | None,
    reason: str,
    numbers: dict[str, Any],
) -> None:
    before = _routing_values(routing)
    routing.candidate_variant = ""
    routing.split_percent = 0
    routing.save()
    rollout.status = CanaryRollout.Status.ROLLED_BACK
    rollout.ended_at = timezone.now()
    rollout.automatic = actor is None
    rollout.rollback_reason = reason
    rollout.rollback_numbers = numbers
    rollout.save()
    _audit(
        actor=actor,
        action=AuditLog.Action.CANARY_ROLLBACK,
        target=rollout.candidate_variant,
        before=before,
        after={**_routing_values(routing), "reason": reason},
    )


def _comparison_record(
    rollout: CanaryRollout,
    routing: CanaryRouting,
    *,
    now: datetime,
    comparison: tuple[canary_selectors.VariantStats, canary_selectors.VariantStats] | None = None,
) -> dict[str, Any]:
    stable, candidate = comparison or canary_selectors.canary_comparison(rollout=rollout, now=now)
    checks = canary_selectors.rule_checks(rollout=rollout, stable=stable, candidate=candidate)
    return {
        "evaluated_at": now.isoformat(),
        "split_percent": routing.split_percent,
        "stable": stable.as_record(),
        "candidate": candidate.as_record(),
        "checks": [
            {"rule": c.rule, "stable": c.stable, "candidate": c.candidate, "limit": c.limit, "state": c.state}
            for c in checks
        ],
    }


def canary_evaluate(*, now: datetime | None = None) -> str:
    """One evaluation of the running canary (the Celery beat task runs it periodically).

    A broken rule rolls the candidate back and records the numbers; otherwise, once the
    current split has been held long enough and the candidate has enough answers to judge,
    the split moves to the plan's next step, or past the last step the candidate is promoted.
    Promotion also needs the candidate's latest quality score to be at least stable's.
    Returns what happened: idle, rolled_back, advanced, promoted, awaiting_quality or holding.
    """
    now = now or timezone.now()
    with transaction.atomic():
        try:
            rollout = _running_locked()
        except ConsoleError:
            return "idle"
        routing = _routing_locked()
        stable, candidate = canary_selectors.canary_comparison(rollout=rollout, now=now)
        checks = canary_selectors.rule_checks(rollout=rollout, stable=stable, candidate=candidate)
        breached = [check.rule for check in checks if check.breached]
        held = now >= rollout.step_started_at + timedelta(seconds=rollout.hold_s(routing.split_percent))
        if breached:
            numbers = _comparison_record(rollout, routing, now=now, comparison=(stable, candidate))
            _rollback(rollout, routing, actor=None, reason=", ".join(breached), numbers=numbers)
            outcome = "rolled_back"
        elif held and candidate.answers >= rollout.min_answers:
            next_percent = rollout.next_percent(routing.split_percent)
            if next_percent is None:
                gate = quality_selectors.quality_gate(
                    stable_variant=rollout.stable_variant, candidate_variant=rollout.candidate_variant
                )
                if not gate.passed:
                    # The candidate keeps its split until a score lets it through, or staff end it.
                    return "awaiting_quality"
                _promote(rollout, routing, actor=None)
                outcome = "promoted"
            else:
                before = _routing_values(routing)
                _split_move(rollout, routing, next_percent, at=now)
                _audit(
                    actor=None,
                    action=AuditLog.Action.CANARY_SPLIT,
                    target=rollout.candidate_variant,
                    before=before,
                    after=_routing_values(routing),
                )
                outcome = "advanced"
        else:
            return "holding"
    canary_mirror()
    return outcome
