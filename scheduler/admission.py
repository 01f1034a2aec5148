"""Admission: rate limit, backpressure, enqueue. One call per generation request.

Each refusal is a typed outcome with an honest Retry-After; nothing half-admitted remains:
the request's record is created before it is enqueued (a worker may finish it at once) and
deleted when it is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import redis
import redis.asyncio as aioredis
from django.conf import settings
from django.utils import timezone

from scheduler import key_limits, keys, metrics, timeseries
from scheduler.generation import Done, GenerationJob, Start, Tier, Timings, Token, Usage, event_encode
from scheduler.key_limits import KeyLimits, KeyLimitState
from scheduler.models import Generation
from scheduler.policy import Policy, tier_policy
from scheduler.queues import job_enqueue
from scheduler.rate_limits import Bucket, address_scope, rate_limit_refund, rate_limit_take
from scheduler.redis import sync_redis
from scheduler.services import generation_create, generation_discard

# A client over its concurrency limit may retry when one of its answers is done; answers take
# seconds, so this is when trying again is likely to work.
CONCURRENCY_RETRY_AFTER_S = 2

_MESSAGES = {
    "concurrency": "You already have several answers in progress. Please wait for one to finish.",
    "user": "You are sending messages too quickly. Please wait a moment.",
    "address": "Too many messages from your network. Please wait a moment.",
    "tier": "Many people are writing right now. Please try again in a moment.",
    "global": "Many people are writing right now. Please try again in a moment.",
    key_limits.REQUESTS_BUCKET: "This API key has sent its requests for this minute.",
    key_limits.TOKENS_BUCKET: "This API key has used its tokens for this minute.",
}


class AdmissionRefused(Exception):
    """`status` is the HTTP status the refusal maps to: 429 (rate) or 503 (capacity, outage).
    `key_state`: the API key's own limits as the decision read them (None: no limits, or not
    read)."""

    def __init__(
        self,
        *,
        status: int,
        reason: str,
        retry_after_s: float,
        message: str,
        key_state: KeyLimitState | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after_s = max(1, math.ceil(retry_after_s))
        self.message = message
        self.key_state = key_state


@dataclass(frozen=True, slots=True)
class Admission:
    request_id: str
    variant: str
    model: str
    tier: Tier
    position: int
    predicted_wait_s: float
    key_state: KeyLimitState | None = None  # the API key's own limits after this request


def _buckets(policy: Policy, client_id: str, client_address: str | None) -> list[Bucket]:
    buckets = [Bucket(keys.bucket_user(client_id), "user", policy.bucket_capacity, policy.refill_per_s)]
    if client_address:
        factor = settings.GUEST_ADDRESS_BUCKET_FACTOR
        buckets.append(
            Bucket(
                keys.bucket_address(address_scope(client_address)),
                "address",
                policy.bucket_capacity * factor,
                policy.refill_per_s * factor,
            )
        )
    buckets.append(
        Bucket(keys.bucket_tier(policy.tier), "tier", policy.tier_bucket_capacity, policy.tier_refill_per_s)
    )
    buckets.append(
        Bucket(
            keys.BUCKET_GLOBAL,
            "global",
            settings.GLOBAL_RATE_LIMIT_CAPACITY,
            settings.GLOBAL_RATE_LIMIT_REFILL_PER_S,
        )
    )
    return buckets


def request_submit(
    *,
    job: GenerationJob,
    client_address: str | None = None,
    limits: KeyLimits | None = None,
    tokens: int = 0,
) -> Admission:
    """Admit and enqueue a generation request, or raise AdmissionRefused.

    `client_address` is given for guests only: their sessions are free to make, their address
    is not. `limits` are an API key's own; `tokens` is the most the request may use (prompt and
    `max_tokens`), which its key's tokens bucket reserves.
    """
    generation_create(job=job)
    return request_admit(job=job, client_address=client_address, limits=limits, tokens=tokens)


def request_admit(
    *,
    job: GenerationJob,
    client_address: str | None = None,
    limits: KeyLimits | None = None,
    tokens: int = 0,
) -> Admission:
    """Admit and enqueue a request whose record the caller has already written (in its own
    transaction, with what it stores beside it), or raise AdmissionRefused and discard the
    record."""
    try:
        admission = _admit(
            job=job, client_address=client_address, limits=limits or KeyLimits(), tokens=tokens
        )
    except AdmissionRefused as refusal:
        generation_discard(request_id=job.request_id)
        # Redis just failed this request: counting the refusal there would only wait again.
        if refusal.reason != "scheduler_unavailable":
            timeseries.refusal_record(reason=refusal.reason)
        metrics.admission_record(tier=job.tier, status=refusal.status, reason=refusal.reason)
        raise
    metrics.admission_record(tier=job.tier)
    return admission


def _rate_limit(
    job: GenerationJob, policy: Policy, buckets: list[Bucket], own: list[Bucket]
) -> KeyLimitState | None:
    """Take the request's tokens and count it in progress, or raise AdmissionRefused (429).
    `own` are the API key's own buckets among `buckets`; returns their state (None: none)."""
    decision = rate_limit_take(
        buckets,
        inflight_key=keys.inflight(job.client_id),
        max_inflight=policy.max_concurrent_per_user,
        request_id=job.request_id,
        lapse_s=_lapse_s(policy),
    )
    key_state = None
    if own and decision.levels:
        levels = {bucket.key: level for bucket, level in zip(buckets, decision.levels, strict=True)}
        key_state = key_limits.key_limit_state(own, levels)
    if not decision.allowed:
        concurrency = decision.limited_by == "concurrency"
        raise AdmissionRefused(
            status=429,
            reason="too_many_in_progress" if concurrency else f"rate_limited_{decision.limited_by}",
            retry_after_s=CONCURRENCY_RETRY_AFTER_S if concurrency else decision.retry_after_s,
            message=_MESSAGES[decision.limited_by or "global"],
            key_state=key_state,
        )
    return key_state


def _lapse_s(policy: Policy) -> float:
    return policy.max_wait_s + settings.GENERATION_TIMEOUT_S


def _unavailable(exc: Exception) -> AdmissionRefused:
    return AdmissionRefused(
        status=503,
        reason="scheduler_unavailable",
        retry_after_s=5,
        message="The service is briefly unavailable. Please try again in a few seconds.",
    )


def _admit(*, job: GenerationJob, client_address: str | None, limits: KeyLimits, tokens: int) -> Admission:
    request_id, client_id = job.request_id, job.client_id
    key_state: KeyLimitState | None = None
    try:
        policy = tier_policy(job.tier)
        own = key_limits.key_buckets(client_id, limits, tokens=tokens)
        buckets = [*own, *_buckets(policy, client_id, client_address)]
        inflight_key = keys.inflight(client_id)
        key_state = _rate_limit(job, policy, buckets, own)
        if limits.tokens_per_minute is not None:
            key_limits.key_tokens_reserve(
                client_id=client_id, request_id=request_id, tokens=tokens, lapse_s=_lapse_s(policy)
            )
        queued = job_enqueue(
            tier=job.tier if settings.SCHEDULER_PRIORITY else Tier.NORMAL,
            job=job,
            max_queued=policy.max_queued,
            wait_slo_s=policy.wait_slo_s,
            max_wait_s=policy.max_wait_s,
        )
        if not queued.admitted:
            rate_limit_refund(buckets, inflight_key=inflight_key, request_id=request_id)
            key_limits.key_tokens_release(client_id=client_id, request_id=request_id)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise _unavailable(exc) from exc
    if not queued.admitted:
        raise AdmissionRefused(
            status=503,
            reason=queued.refusal or "overloaded",
            retry_after_s=queued.predicted_wait_s,
            message="We are very busy right now. Please try again shortly.",
        )
    return Admission(
        request_id=request_id,
        variant=job.variant,
        model=job.model,
        tier=job.tier,
        position=queued.position,
        predicted_wait_s=queued.predicted_wait_s,
        key_state=key_state,
    )


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    """An answer the result cache found for a request (knowledge.cache decides what may be)."""

    text: str
    result: str  # scheduler.models.CacheResult: exact, semantic or pinned
    lookup_ms: float
    saved_engine_ms: float  # what generating it took the engine
    completion_tokens: int


def request_answer_cached(
    *,
    job: GenerationJob,
    answer: CachedAnswer,
    client_address: str | None = None,
    limits: KeyLimits | None = None,
    tokens: int = 0,
) -> Admission:
    """Answer a request from the result cache: no queue, no worker, no GPU slot. The request
    still passes its rate limits (a hit is cheap, a flood of them is not free), gets its
    record, finished at once, and a result stream in the same contract as a generated answer,
    whose `done` says `cached`. `limits` are an API key's own; `tokens` is what the answer
    used (prompt and completion), which its key's tokens bucket is charged outright (nothing
    is reserved, so nothing is settled later). Raises AdmissionRefused as request_submit does."""
    generation_create(job=job)
    return request_admit_cached(
        job=job, answer=answer, client_address=client_address, limits=limits, tokens=tokens
    )


def request_admit_cached(
    *,
    job: GenerationJob,
    answer: CachedAnswer,
    client_address: str | None = None,
    limits: KeyLimits | None = None,
    tokens: int = 0,
) -> Admission:
    """request_answer_cached for a request whose record the caller has already written (in
    its own transaction, with what it stores beside it); a refusal discards the record."""
    try:
        policy = tier_policy(job.tier)
        own = key_limits.key_buckets(job.client_id, limits or KeyLimits(), tokens=tokens)
        key_state = _rate_limit(job, policy, [*own, *_buckets(policy, job.client_id, client_address)], own)
        usage = Usage(completion_tokens=answer.completion_tokens)
        events = [
            Start(worker="cache", variant=job.variant, attempt=1),
            Token(seq=0, text=answer.text),
            Done(
                finish_reason="stop",
                usage=usage,
                timings=Timings(
                    queue_ms=0.0, ttft_ms=answer.lookup_ms, duration_ms=answer.lookup_ms, engine="cache"
                ),
                cached=True,
            ),
        ]
        Generation.objects.filter(request_id=job.request_id).update(
            status=Generation.Status.DONE,
            text=answer.text,
            finish_reason="stop",
            completion_tokens=answer.completion_tokens,
            queue_ms=0.0,
            ttft_ms=answer.lookup_ms,
            duration_ms=answer.lookup_ms,
            engine="cache",
            cache=answer.result,
            cache_lookup_ms=answer.lookup_ms,
            saved_engine_ms=answer.saved_engine_ms,
            finished_at=timezone.now(),
        )
        stream = keys.result(job.model, job.request_id)
        pipe = sync_redis().pipeline(transaction=True)
        for body in events:
            kind, data = event_encode(body)
            pipe.xadd(stream, {"type": kind, "data": data})
        pipe.expire(stream, settings.RESULT_TTL_S)
        pipe.zrem(keys.inflight(job.client_id), job.request_id)
        pipe.execute()
    except AdmissionRefused as refusal:
        generation_discard(request_id=job.request_id)
        metrics.admission_record(tier=job.tier, status=refusal.status, reason=refusal.reason)
        raise
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        Generation.objects.filter(request_id=job.request_id).delete()
        raise _unavailable(exc) from exc
    metrics.admission_record(tier=job.tier)
    return Admission(
        request_id=job.request_id,
        variant=job.variant,
        model=job.model,
        tier=job.tier,
        position=0,
        predicted_wait_s=0.0,
        key_state=key_state,
    )


async def request_finished(
    client: aioredis.Redis, *, client_id: str, request_id: str, tokens_used: int
) -> None:
    """The request no longer counts against its client's concurrency limit, and its API key's
    token reservation is settled with what it used. Idempotent."""
    await key_limits.request_settle(
        client, client_id=client_id, request_id=request_id, tokens_used=tokens_used
    )
