"""Writes of the model variants page: adding and changing a variant."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from accounts.models import User
from admin_console.models import AuditLog
from admin_console.services.audit import _audit
from scheduler.models import Variant

VARIANT_FIELDS = (
    "model",
    "system_prompt",
    "temperature",
    "top_p",
    "frequency_penalty",
    "max_tokens",
    "knowledge",
    "answer_style",
    "tool_call_parser",
    "description",
)


def _variant_values(variant: Variant) -> dict[str, Any]:
    return {name: getattr(variant, name) for name in VARIANT_FIELDS}


def variant_create(*, actor: User, name: str, values: dict[str, Any]) -> Variant:
    """Add a variant; the canary can try it once a live worker serves its model. Raises
    ValidationError (a field, or the name taken)."""
    with transaction.atomic():
        variant = Variant(name=name, **{field: values[field] for field in VARIANT_FIELDS if field in values})
        variant.full_clean()
        variant.save()
        _audit(
            actor=actor,
            action=AuditLog.Action.VARIANT_CREATE,
            target=name,
            before=None,
            after=_variant_values(variant),
        )
    return variant


def variant_update(*, actor: User, name: str, changes: dict[str, Any]) -> Variant:
    """Change a variant: the questions routed to it from then on (within a second in every web
    process: scheduler.routing) are asked its new way; answers already queued keep the prompt and
    sampling they were queued with. Raises Variant.DoesNotExist or ValidationError."""
    with transaction.atomic():
        variant = Variant.objects.select_for_update().get(name=name)
        before = _variant_values(variant)
        for field in VARIANT_FIELDS:
            if field in changes:
                setattr(variant, field, changes[field])
        variant.full_clean()
        after = _variant_values(variant)
        if after == before:
            return variant
        variant.save()
        _audit(actor=actor, action=AuditLog.Action.VARIANT_UPDATE, target=name, before=before, after=after)
    return variant
