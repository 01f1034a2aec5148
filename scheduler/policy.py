"""Per-tier admission policy: bucket size and refill, queue bound, wait SLO."""

from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True, slots=True)
class TierPolicy:
    tier: str
    bucket_capacity: int
    refill_per_s: float
    max_queued: int
    wait_slo_s: float


def tier_policy(tier: str) -> TierPolicy:
    return TierPolicy(tier=tier, **settings.RATE_LIMIT_POLICIES[tier])
