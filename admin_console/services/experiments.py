"""Writes of the A/B experiments page: starting an experiment, and ending it by keeping one arm."""

from __future__ import annotations

import secrets
from typing import Any

from django.db import transaction
from django.utils import timezone

from accounts.models import User
from admin_console.models import AuditLog
from admin_console.selectors import canary as canary_selectors
from admin_console.services.audit import ConsoleError, _audit
from admin_console.services.canary import _routing_locked
from scheduler.models import Experiment, Variant
from scheduler.routing import canary_mirror, experiment_mirror
from scheduler.workers import live_workers


def _experiment_values(experiment: Experiment) -> dict[str, Any]:
    return {
        "variant_a": experiment.variant_a,
        "variant_b": experiment.variant_b,
        "split_percent": experiment.split_percent,
        "status": experiment.status,
        "kept_variant": experiment.kept_variant,
    }


def experiment_start(*, actor: User, variant_a: str, variant_b: str, split_percent: int) -> Experiment:
    """Split customers between two variants, `split_percent` of them on the first, until staff
    keep one. Raises ConsoleError (one runs already, a variant does not exist or no live worker
    serves its model) or ValidationError."""
    serving = {w.model for w in live_workers() if not w.state.get("draining")}
    with transaction.atomic():
        if Experiment.objects.select_for_update().filter(status=Experiment.Status.RUNNING).exists():
            raise ConsoleError("An experiment is already running: keep one of its arms first.")
        models = dict(Variant.objects.filter(name__in=[variant_a, variant_b]).values_list("name", "model"))
        for name in (variant_a, variant_b):
            if name not in models:
                raise ConsoleError(f"There is no variant {name!r}.")
            if models[name] not in serving:
                raise ConsoleError(f"No live worker serves {models[name]!r}, the model of {name!r}.")
        experiment = Experiment(
            variant_a=variant_a, variant_b=variant_b, split_percent=split_percent, salt=secrets.token_hex(8)
        )
        experiment.full_clean()
        experiment.save()
        _audit(
            actor=actor,
            action=AuditLog.Action.EXPERIMENT_START,
            target=f"{variant_a} vs {variant_b}",
            before=None,
            after=_experiment_values(experiment),
        )
    experiment_mirror()
    return experiment


def experiment_end(*, actor: User, keep: str) -> Experiment:
    """End the running experiment by keeping one arm: that variant answers every customer from
    now on (it becomes the stable variant). Raises ConsoleError when none runs, `keep` is not
    one of its arms, or a canary runs against another stable variant (end that first)."""
    with transaction.atomic():
        experiment = Experiment.objects.select_for_update().filter(status=Experiment.Status.RUNNING).first()
        if experiment is None:
            raise ConsoleError("No experiment is running.")
        if keep not in experiment.arms:
            raise ConsoleError(f"{keep!r} is not one of the experiment's variants.")
        routing = _routing_locked()
        if keep != routing.stable_variant and canary_selectors.running_rollout() is not None:
            raise ConsoleError(
                "A canary is running against the stable variant: promote it or roll it back first."
            )
        before = {**_experiment_values(experiment), "stable_variant": routing.stable_variant}
        experiment.status = Experiment.Status.ENDED
        experiment.kept_variant = keep
        experiment.ended_at = timezone.now()
        experiment.save()
        routing.stable_variant = keep
        routing.save()
        _audit(
            actor=actor,
            action=AuditLog.Action.EXPERIMENT_END,
            target=f"{experiment.variant_a} vs {experiment.variant_b}",
            before=before,
            after={**_experiment_values(experiment), "stable_variant": keep},
        )
    canary_mirror()
    experiment_mirror()
    return experiment
