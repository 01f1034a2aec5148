"""API keys: issue (the plaintext is returned once), revoke, and authenticate a presented key.

Keys are 32 random bytes, so a single SHA-256 is enough to store them safely (a slow password
hash guards guessable secrets, which these are not) and lets a request find its key by index.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.db.models import QuerySet
from django.utils import timezone

from accounts.models import ACCOUNT_TIERS, User
from api import jobs
from api.models import ApiKey

KEY_PREFIX = "sk-"
VISIBLE_CHARS = 8  # of the random part, shown in lists: enough to tell keys apart
# Recording every use would be a database write per API call; a minute's precision is plenty
# for "is this key still in use?".
LAST_USED_PRECISION = timedelta(minutes=1)


class ApiKeyInvalid(Exception):
    """The presented key is unknown, revoked, or its owner's account is disabled."""


@dataclass(frozen=True, slots=True)
class IssuedApiKey:
    api_key: ApiKey
    plaintext: str  # shown to the owner once; never stored


def _hash(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def api_key_create(*, owner: User, name: str = "", tier: str = "") -> IssuedApiKey:
    """Issue a key. `tier` empty means the key follows its owner's tier."""
    if tier and tier not in ACCOUNT_TIERS:
        raise ValueError(f"Unknown tier {tier!r}; choose one of {', '.join(ACCOUNT_TIERS)}.")
    plaintext = KEY_PREFIX + secrets.token_urlsafe(32)
    api_key = ApiKey.objects.create(
        owner=owner,
        name=name,
        tier=tier,
        prefix=plaintext[: len(KEY_PREFIX) + VISIBLE_CHARS],
        key_hash=_hash(plaintext),
    )
    return IssuedApiKey(api_key=api_key, plaintext=plaintext)


def api_key_revoke(*, api_key: ApiKey) -> bool:
    """Revoke at once: the next call with the key gets 401, and the jobs it submitted stop
    (status `key_revoked`). False when already revoked."""
    revoked = ApiKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    api_key.refresh_from_db(fields=["revoked_at"])
    if revoked:
        jobs.jobs_stop_for_revoked_key(api_key=api_key)
    return revoked == 1


def api_key_authenticate(*, plaintext: str) -> ApiKey:
    """The active key this plaintext is, with its owner loaded; raises ApiKeyInvalid."""
    if not plaintext.startswith(KEY_PREFIX):
        raise ApiKeyInvalid("Incorrect API key provided.")
    try:
        api_key = ApiKey.objects.select_related("owner").get(key_hash=_hash(plaintext))
    except ApiKey.DoesNotExist as exc:
        raise ApiKeyInvalid("Incorrect API key provided.") from exc
    if api_key.revoked_at is not None:
        raise ApiKeyInvalid("This API key has been revoked.")
    if not api_key.owner.is_active:
        raise ApiKeyInvalid("The account this API key belongs to is disabled.")
    now = timezone.now()
    if api_key.last_used_at is None or now - api_key.last_used_at >= LAST_USED_PRECISION:
        ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
        api_key.last_used_at = now
    return api_key


def api_key_list(*, owner: User | None = None) -> QuerySet[ApiKey]:
    keys = ApiKey.objects.select_related("owner")
    return keys.filter(owner=owner) if owner is not None else keys.all()


def api_key_get(*, prefix: str) -> ApiKey:
    """Raises ApiKey.DoesNotExist."""
    return ApiKey.objects.select_related("owner").get(prefix=prefix)
