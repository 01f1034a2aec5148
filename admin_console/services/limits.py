"""Writes of the rate limits page: the tiers' policies and the fair share's weights per origin."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from accounts.models import User
from admin_console.models import AuditLog
from admin_console.selectors import limits as limits_selectors
from admin_console.services.audit import _audit
from scheduler import fair_share
from scheduler.models import SourceWeight, TierPolicy
from scheduler.policy import policies_mirror

POLICY_FIELDS = tuple(f.name for f in TierPolicy._meta.fields if f.name not in {"tier", "updated_at"})


def _policy_values(policy: TierPolicy) -> dict[str, Any]:
    return {name: getattr(policy, name) for name in POLICY_FIELDS}


def policy_update(*, actor: User, tier: str, changes: dict[str, Any]) -> TierPolicy:
    """Change a tier's policy. Raises TierPolicy.DoesNotExist or ValidationError."""
    with transaction.atomic():
        policy = TierPolicy.objects.select_for_update().get(tier=tier)
        before = _policy_values(policy)
        for name in POLICY_FIELDS:
            if name in changes:
                setattr(policy, name, changes[name])
        policy.full_clean()
        after = _policy_values(policy)
        if after == before:
            return policy
        policy.save()
        _audit(actor=actor, action=AuditLog.Action.POLICY_UPDATE, target=tier, before=before, after=after)
    policies_mirror()
    return policy


FAIR_SHARE_TARGET = "fair share"  # the audit log's name for the weights per origin


def source_weights_set(*, actor: User, weights: dict[str, float]) -> bool:
    """Set the fair share's weight of each origin named in `weights` (scheduler/fair_share.py);
    every web process applies it within a second. False when nothing changed. Raises
    ValidationError."""
    with transaction.atomic():
        before = limits_selectors.source_weights()
        changed = {origin: weight for origin, weight in weights.items() if before.get(origin) != weight}
        if not changed:
            return False
        for origin, weight in changed.items():
            row = SourceWeight(origin=origin, weight=weight)
            row.full_clean(validate_unique=False)
            row.save()
        _audit(
            actor=actor,
            action=AuditLog.Action.POLICY_UPDATE,
            target=FAIR_SHARE_TARGET,
            before=before,
            after=before | changed,
        )
    fair_share.weights_forget()
    return True
