"""Writes of the API keys page (and `manage.py apikey`): issuing, revoking and limiting a key."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from accounts.models import User
from admin_console.models import AuditLog
from admin_console.services.audit import _audit
from api import keys as api_keys
from api.keys import IssuedApiKey
from api.models import ApiKey

# `actor` None: a key managed from the command line (`manage.py apikey`), named as such.
COMMAND_LINE_ACTOR_NAME = "manage.py apikey"


def _api_key_values(api_key: ApiKey) -> dict[str, Any]:
    return {
        "owner": api_key.owner.get_username(),
        "name": api_key.name,
        "tier": api_key.tier or "owner's",
        "revoked": api_key.revoked_at is not None,
    }


def _api_key_limit_values(api_key: ApiKey) -> dict[str, Any]:
    return {
        "requests_per_minute": api_key.requests_per_minute,
        "tokens_per_minute": api_key.tokens_per_minute,
        "fair_share_weight": api_key.fair_share_weight,
    }


def api_key_create(*, actor: User | None, owner: User, name: str = "", tier: str = "") -> IssuedApiKey:
    with transaction.atomic():
        issued = api_keys.api_key_create(owner=owner, name=name, tier=tier)
        _audit(
            actor=actor,
            action=AuditLog.Action.API_KEY_CREATE,
            target=issued.api_key.prefix,
            before=None,
            after=_api_key_values(issued.api_key),
            unattended_by=COMMAND_LINE_ACTOR_NAME,
        )
    return issued


def api_key_revoke(*, actor: User | None, api_key: ApiKey) -> bool:
    """False when the key was already revoked (nothing to audit)."""
    with transaction.atomic():
        before = _api_key_values(api_key)
        revoked = api_keys.api_key_revoke(api_key=api_key)
        if revoked:
            _audit(
                actor=actor,
                action=AuditLog.Action.API_KEY_REVOKE,
                target=api_key.prefix,
                before=before,
                after=_api_key_values(api_key),
                unattended_by=COMMAND_LINE_ACTOR_NAME,
            )
    return revoked


def api_key_limits_set(
    *,
    actor: User | None,
    api_key: ApiKey,
    requests_per_minute: int | None,
    tokens_per_minute: int | None,
    fair_share_weight: float | None,
) -> bool:
    """Set the key's own limits (None: unlimited) and its fair-share weight (None: the API's);
    they apply to its next request, since admission reads them from the key each time. False
    when nothing changed. Raises ValidationError."""
    with transaction.atomic():
        locked = ApiKey.objects.select_for_update().get(pk=api_key.pk)
        before = _api_key_limit_values(locked)
        locked.requests_per_minute = requests_per_minute
        locked.tokens_per_minute = tokens_per_minute
        locked.fair_share_weight = fair_share_weight
        locked.full_clean(validate_unique=False, validate_constraints=False)
        after = _api_key_limit_values(locked)
        if after == before:
            return False
        locked.save(update_fields=["requests_per_minute", "tokens_per_minute", "fair_share_weight"])
        _audit(
            actor=actor,
            action=AuditLog.Action.API_KEY_LIMITS,
            target=locked.prefix,
            before=before,
            after=after,
            unattended_by=COMMAND_LINE_ACTOR_NAME,
        )
    api_key.requests_per_minute, api_key.tokens_per_minute = requests_per_minute, tokens_per_minute
    api_key.fair_share_weight = fair_share_weight
    return True
