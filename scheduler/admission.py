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

from scheduler import control, fair_share, key_limits, keys, metrics, timeseries
from scheduler.generation import (
    Done,
    GenerationJob,
    GroundingReport,
    Start,
    Tier,
    Timings,
    Token,
    Usage,
    event_encode,
)
from scheduler.key_limits import KeyLimits, KeyLimitState
from scheduler.models import Generation
from scheduler.policy import Policy, tier_policy
from scheduler.queues import job_enqueue
from scheduler.rate_limits import (
    Bucket,
    RateCharge,
    RateDecision,
    address_scope,
    rate_limit_refund,
    rate_limit_take,
)
from scheduler.redis import sync_redis
from scheduler.services import GenerationOutcome, generation_create, generation_discard, generation_finish

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


def request_withdraw(*, job: GenerationJob, limits: KeyLimits | None = None, tokens: int = 0) -> None:
    """Take back a request admitted moments ago whose caller gave up the whole call (a choice
    of the same `n` was refused): it is cancelled, its record is forgotten and every limit
    gets back what admitting it took (the same `limits` and `tokens`), so that a refused call
    charges nothing anywhere."""
    charge = _charge(
        job, tier_policy(job.tier), limits or KeyLimits(), client_address=None, tokens=tokens, reserve=True
    )
    control.request_cancel(request_id=job.request_id)
    rate_limit_refund(charge)
    generation_discard(request_id=job.request_id)


def _charge(
    job: GenerationJob,
    policy: Policy,
    limits: KeyLimits,
    *,
    client_address: str | None,
    tokens: int,
    reserve: bool,
) -> RateCharge:
    """What admitting the request takes: the API key's own buckets (`tokens` from its tokens
    bucket, noted as a reservation to settle when `reserve`), then the client's, address's,
    tier's and global ones, and a place among the client's unfinished requests."""
    own = key_limits.key_buckets(job.limits_client_id, limits, tokens=tokens)
    reservation = None
    if reserve and limits.tokens_per_minute is not None:
        reservation = (keys.key_token_reservations(job.limits_client_id), float(tokens))
    return RateCharge(
        buckets=(*own, *_buckets(policy, job.client_id, client_address)),
        inflight_key=keys.inflight(job.client_id),
        max_inflight=policy.max_concurrent_per_user,
        request_id=job.request_id,
        lapse_s=_lapse_s(policy),
        reservation=reservation,
    )


def _key_state(charge: RateCharge, decision: RateDecision) -> KeyLimitState | None:
    """The API key's own limits at the levels the decision read (None: the key has none)."""
    own = [bucket for bucket in charge.buckets if bucket.name in key_limits.KEY_BUCKETS]
    if not own or not decision.levels:
        return None
    levels = {bucket.key: level for bucket, level in zip(charge.buckets, decision.levels, strict=True)}
    return key_limits.key_limit_state(own, levels)


def _rate_limited(decision: RateDecision, key_state: KeyLimitState | None) -> AdmissionRefused:
    concurrency = decision.limited_by == "concurrency"
    return AdmissionRefused(
        status=429,
        reason="too_many_in_progress" if concurrency else f"rate_limited_{decision.limited_by}",
        retry_after_s=CONCURRENCY_RETRY_AFTER_S if concurrency else decision.retry_after_s,
        message=_MESSAGES[decision.limited_by or "global"],
        key_state=key_state,
    )


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
    try:
        policy = tier_policy(job.tier)
        charge = _charge(job, policy, limits, client_address=client_address, tokens=tokens, reserve=True)
        # One script call: the rate limit, the queue's bound and predicted wait, then (all
        # passed) the charge and the job on its queue.
        queued = job_enqueue(
            tier=job.tier if settings.SCHEDULER_PRIORITY else Tier.NORMAL,
            job=job,
            max_queued=policy.max_queued,
            wait_slo_s=policy.wait_slo_s,
            max_wait_s=policy.max_wait_s,
            charge=charge,
            share=fair_share.job_fair_share(
                job, key_weight=limits.fair_share_weight, guest_address=client_address
            ),
        )
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise _unavailable(exc) from exc
    if queued.rate is not None and not queued.rate.allowed:
        raise _rate_limited(queued.rate, _key_state(charge, queued.rate))
    if not queued.admitted:
        raise AdmissionRefused(
            status=503,
            reason=queued.refusal or "overloaded",
            retry_after_s=queued.predicted_wait_s,
            message="We are very busy right now. Please try again shortly.",
        )
    return Admission(
        request_id=job.request_id,
        variant=job.variant,
        model=job.model,
        tier=job.tier,
        position=queued.position,
        predicted_wait_s=queued.predicted_wait_s,
        key_state=_key_state(charge, queued.rate) if queued.rate is not None else None,
    )


@dataclass(frozen=True, slots=True)
class KnownAnswer:
    """An answer known before any model runs: one the result cache found for the request
    (knowledge.cache decides what may be served), or one the help center gives without a model
    (knowledge.answers: its own sentences, the decline, a greeting)."""

    text: str
    engine: str  # what answered, as records and timings name it: "cache" or "help-center"
    lookup_ms: float  # how long finding it took
    completion_tokens: int
    cache: str = ""  # from the result cache: how it matched (scheduler.models.CacheResult)
    saved_engine_ms: float | None = None  # from the result cache: what generating it took
    grounding: GroundingReport | None = None  # a chat answer's check (extractive, a decline)


CACHE = "cache"
HELP_CENTER = "help-center"


def request_answer_known(
    *,
    job: GenerationJob,
    answer: KnownAnswer,
    client_address: str | None = None,
    limits: KeyLimits | None = None,
    tokens: int = 0,
) -> Admission:
    """Answer a request with an answer known already: no queue, no worker, no GPU slot. The
    request still passes its rate limits (an answer like that is cheap, a flood of them is not
    free), gets its record, finished at once, and a result stream in the same contract as a
    generated answer, whose `done` says `cached` when it came from the result cache. `limits`
    are an API key's own; `tokens` is what the answer used (prompt and completion), which its
    key's tokens bucket is charged outright (nothing is reserved, so nothing is settled later).
    Raises AdmissionRefused as request_submit does."""
    generation_create(job=job)
    return request_admit_known(
        job=job, answer=answer, client_address=client_address, limits=limits, tokens=tokens
    )


def request_admit_known(
    *,
    job: GenerationJob,
    answer: KnownAnswer,
    client_address: str | None = None,
    limits: KeyLimits | None = None,
    tokens: int = 0,
) -> Admission:
    """request_answer_known for a request whose record the caller has already written (in
    its own transaction, with what it stores beside it); a refusal discards the record."""
    try:
        policy = tier_policy(job.tier)
        charge = _charge(
            job, policy, limits or KeyLimits(), client_address=client_address, tokens=tokens, reserve=False
        )
        decision = rate_limit_take(charge)
        key_state = _key_state(charge, decision)
        if not decision.allowed:
            raise _rate_limited(decision, key_state)
        usage = Usage(completion_tokens=answer.completion_tokens)
        lookup_ms = answer.lookup_ms
        timings = Timings(queue_ms=0.0, ttft_ms=lookup_ms, duration_ms=lookup_ms, engine=answer.engine)
        events = [
            Start(worker=answer.engine, variant=job.variant, attempt=1),
            Token(seq=0, text=answer.text, tokens=answer.completion_tokens),
            Done(
                finish_reason="stop",
                usage=usage,
                timings=timings,
                cached=answer.engine == CACHE,
                grounding=answer.grounding,
            ),
        ]
        generation_finish(
            request_id=job.request_id,
            outcome=GenerationOutcome(
                status=Generation.Status.DONE,
                text=answer.text,
                finish_reason="stop",
                usage=usage,
                timings=timings,
                cache=answer.cache,
                saved_engine_ms=answer.saved_engine_ms,
                grounding=answer.grounding,
            ),
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
        generation_discard(request_id=job.request_id, answered_by=answer.engine)
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
    client: aioredis.Redis,
    *,
    client_id: str,
    request_id: str,
    tokens_used: int,
    limits_client_id: str | None = None,
) -> None:
    """The request no longer counts against its client's concurrency limit, and its API key's
    token reservation (`limits_client_id`'s, when not the client's: GenerationJob's) is settled
    with what it used. Idempotent."""
    await key_limits.request_settle(
        client,
        client_id=client_id,
        limits_client_id=limits_client_id or client_id,
        request_id=request_id,
        tokens_used=tokens_used,
    )
