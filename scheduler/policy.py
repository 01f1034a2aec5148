"""Tier policies: the database holds them, Redis mirrors them, admission reads the mirror.

Every process reads a policy from Redis at most once a second, so an edit in the console
applies everywhere within a second. When the mirror is missing (Redis lost its data), it is
rebuilt from the database.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, fields

from scheduler import keys
from scheduler.models import TierPolicy
from scheduler.redis import sync_redis

CACHE_S = 1.0


@dataclass(frozen=True, slots=True)
class Policy:
    tier: str
    bucket_capacity: int
    refill_per_s: float
    tier_bucket_capacity: int
    tier_refill_per_s: float
    max_concurrent_per_user: int
    max_queued: int
    wait_slo_s: float
    max_wait_s: float

    @classmethod
    def from_mapping(cls, values: dict) -> Policy:
        """From a model row's values or a Redis hash (all strings)."""
        return cls(**{name: cast(values[name]) for name, cast in _CASTS.items()})


# Annotations are strings here (postponed evaluation): map them to their converters.
_CASTS = {f.name: {"int": int, "float": float, "str": str}[f.type] for f in fields(Policy)}

_cache: dict[str, tuple[float, Policy]] = {}


def policies_mirror() -> list[Policy]:
    """Write every policy from the database into Redis; returns them."""
    policies = [Policy.from_mapping(row) for row in TierPolicy.objects.values()]
    with sync_redis().pipeline(transaction=False) as pipe:
        for policy in policies:
            pipe.hset(keys.policy(policy.tier), mapping={k: str(v) for k, v in asdict(policy).items()})
        pipe.execute()
    _cache.clear()
    return policies


def tier_policy(tier: str) -> Policy:
    cached = _cache.get(tier)
    if cached is not None and time.monotonic() - cached[0] < CACHE_S:
        return cached[1]
    values = sync_redis().hgetall(keys.policy(tier))
    if values:
        policy = Policy.from_mapping(values)
    else:
        policy = next((p for p in policies_mirror() if p.tier == tier), None)
        if policy is None:
            raise LookupError(f"No policy for tier {tier!r}")
    _cache[tier] = (time.monotonic(), policy)
    return policy
