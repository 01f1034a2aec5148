"""Reads of the rate limits page: the tiers' policies and the fair share's weights."""

from __future__ import annotations

from scheduler import fair_share, keys
from scheduler.models import TierPolicy


def tier_policies() -> list[TierPolicy]:
    order = {tier: index for index, tier in enumerate(keys.TIERS)}
    return sorted(TierPolicy.objects.all(), key=lambda policy: order.get(policy.tier, len(order)))


def source_weights() -> dict[str, float]:
    """The fair share's weight of each origin (1 when never set), in the origins' order."""
    return fair_share.weights_stored()
