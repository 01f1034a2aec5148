"""Admission: rate limit, backpressure, routing, enqueue. One call per generation request.

Each refusal is a typed outcome with an honest Retry-After; nothing half-admitted remains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import redis

from scheduler import keys
from scheduler.policy import tier_policy
from scheduler.queues import job_enqueue
from scheduler.rate_limits import Bucket, buckets_take


class AdmissionRefused(Exception):
    """`status` is the HTTP status the refusal maps to: 429 (rate) or 503 (capacity, outage)."""

    def __init__(self, *, status: int, reason: str, retry_after_s: float, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after_s = max(1, math.ceil(retry_after_s))
        self.message = message


@dataclass(frozen=True, slots=True)
class Admission:
    request_id: str
    variant: str
    tier: str
    position: int
    predicted_wait_s: float


def request_submit(
    *,
    request_id: str,
    client_id: str,
    tier: str,
    variant: str,
    payload: dict[str, Any],
) -> Admission:
    policy = tier_policy(tier)
    try:
        decision = buckets_take(
            [Bucket(keys.bucket_user(client_id), "user", policy.bucket_capacity, policy.refill_per_s)]
        )
        if not decision.allowed:
            raise AdmissionRefused(
                status=429,
                reason=f"rate_limited_{decision.limited_by}",
                retry_after_s=decision.retry_after_s,
                message="You are sending messages too quickly. Please wait a moment.",
            )
        queued = job_enqueue(
            variant=variant,
            tier=tier,
            request_id=request_id,
            payload=payload,
            max_queued=policy.max_queued,
            wait_slo_s=policy.wait_slo_s,
        )
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise AdmissionRefused(
            status=503,
            reason="scheduler_unavailable",
            retry_after_s=5,
            message="The service is briefly unavailable. Please try again in a few seconds.",
        ) from exc
    if not queued.admitted:
        raise AdmissionRefused(
            status=503,
            reason=queued.refusal or "overloaded",
            retry_after_s=queued.predicted_wait_s,
            message="We are very busy right now. Please try again shortly.",
        )
    return Admission(
        request_id=request_id,
        variant=variant,
        tier=tier,
        position=queued.position,
        predicted_wait_s=queued.predicted_wait_s,
    )
