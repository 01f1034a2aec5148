"""The console's time series: per-10-second buckets in Redis, kept for 20 minutes.

Workers record each finished answer (status, TTFT, inter-token latency, output tokens) and,
with every heartbeat, their model's queue depths; admission records each refusal. The
console reads the buckets back. Latencies are counted in fixed log-spaced bins, so a bucket
stays small at any traffic and a percentile over any window is a sum of bins (as with a
Prometheus histogram). This is separate from /metrics: Prometheus objects live in one process,
while the console must see what every worker and web process did.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import redis
import redis.asyncio as aioredis

from scheduler import keys
from scheduler.redis import sync_redis
from scheduler.services import GenerationOutcome

logger = logging.getLogger(__name__)

BUCKET_S = 10
RETENTION_S = 20 * 60
# Upper bounds of the latency bins in ms, 25% apart from 1 ms to about 2 minutes: a percentile
# read from them is within about 12% of the exact one. The last bin catches everything above.
LATENCY_BOUNDS_MS: tuple[float, ...] = tuple(1.25**i for i in range(54))

_REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError)


def bucket_start(at: float) -> int:
    return int(at // BUCKET_S * BUCKET_S)


def latency_bin(value_ms: float) -> int:
    if value_ms <= 1.0:
        return 0
    return min(len(LATENCY_BOUNDS_MS) - 1, math.ceil(math.log(value_ms, 1.25) - 1e-9))


def latency_bins(values_ms: Iterable[float]) -> Counter[int]:
    """Latencies counted in their bins, as answer_record counts them."""
    return Counter(latency_bin(value) for value in values_ms)


def latency_percentile(bins: Mapping[int, int], quantile: float) -> float | None:
    """The quantile (0..1) of the counted latencies in ms, interpolated within its bin."""
    total = sum(bins.values())
    if total == 0:
        return None
    rank = quantile * total
    seen = 0
    for index in sorted(bins):
        count = bins[index]
        if count and seen + count >= rank:
            lower = LATENCY_BOUNDS_MS[index - 1] if index > 0 else 0.0
            upper = LATENCY_BOUNDS_MS[index]
            return lower + (upper - lower) * max(0.0, rank - seen) / count
        seen += count
    return LATENCY_BOUNDS_MS[max(bins)]


# --- writing ------------------------------------------------------------------------------------


async def answer_record(client: aioredis.Redis, *, variant: str, outcome: GenerationOutcome) -> None:
    """Count one finished answer (any status); latencies only when it produced tokens."""
    status, output_tokens = outcome.status, outcome.usage.completion_tokens
    ttft_ms = outcome.timings.ttft_ms if outcome.timings else None
    duration_ms = outcome.timings.duration_ms if outcome.timings else None
    key = keys.series_bucket(bucket_start(time.time()))
    try:
        async with client.pipeline(transaction=False) as pipe:
            pipe.hincrby(key, f"answers:{variant}:{status}", 1)
            if output_tokens:
                pipe.hincrby(key, "tokens", output_tokens)
            if ttft_ms is not None:
                pipe.hincrby(key, f"ttft:{latency_bin(ttft_ms)}", 1)
                if duration_ms is not None and output_tokens > 1:
                    itl_ms = max(0.0, duration_ms - ttft_ms) / (output_tokens - 1)
                    pipe.hincrby(key, f"itl:{latency_bin(itl_ms)}", 1)
            pipe.expire(key, RETENTION_S)
            await pipe.execute()
    except _REDIS_ERRORS as exc:
        # The console's numbers are not worth delaying an answer for.
        logger.warning("could not record an answer in the console's series (%s)", exc)


async def queue_depth_record(client: aioredis.Redis, *, model: str) -> None:
    """Sample the model's queue depth per tier into the current bucket (last sample wins)."""
    counters = [
        key for tier in keys.TIERS for key in (keys.enqueue_seq(model, tier), keys.claimed_seq(model, tier))
    ]
    key = keys.series_bucket(bucket_start(time.time()))
    try:
        values = await client.mget(counters)
        depths = {
            f"depth:{model}:{tier}": max(0, int(values[2 * i] or 0) - int(values[2 * i + 1] or 0))
            for i, tier in enumerate(keys.TIERS)
        }
        async with client.pipeline(transaction=False) as pipe:
            pipe.hset(key, mapping=depths)
            pipe.expire(key, RETENTION_S)
            await pipe.execute()
    except _REDIS_ERRORS as exc:
        logger.warning("could not sample queue depths for the console (%s)", exc)


def refusal_record(*, reason: str) -> None:
    key = keys.series_bucket(bucket_start(time.time()))
    try:
        with sync_redis().pipeline(transaction=False) as pipe:
            pipe.hincrby(key, f"refused:{reason}", 1)
            pipe.expire(key, RETENTION_S)
            pipe.execute()
    except _REDIS_ERRORS as exc:
        logger.warning("could not record a refusal in the console's series (%s)", exc)


# --- reading ------------------------------------------------------------------------------------


@dataclass(slots=True)
class SeriesBucket:
    start: int  # unix seconds
    answers: Counter[tuple[str, str]] = field(default_factory=Counter)  # (variant, status) -> n
    output_tokens: int = 0
    ttft_bins: Counter[int] = field(default_factory=Counter)
    itl_bins: Counter[int] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)  # reason -> n
    # (model, tier) -> queued jobs at the bucket's last sample; empty when nobody sampled
    queue_depth: dict[tuple[str, str], int] = field(default_factory=dict)

    @classmethod
    def from_hash(cls, start: int, values: Mapping[str, str]) -> SeriesBucket:
        bucket = cls(start)
        for name, raw in values.items():
            kind, _, rest = name.partition(":")
            value = int(raw)
            if kind == "answers":
                variant, _, status = rest.rpartition(":")
                bucket.answers[(variant, status)] += value
            elif kind == "tokens":
                bucket.output_tokens += value
            elif kind == "ttft":
                bucket.ttft_bins[int(rest)] += value
            elif kind == "itl":
                bucket.itl_bins[int(rest)] += value
            elif kind == "refused":
                bucket.refusals[rest] += value
            elif kind == "depth":
                model, _, tier = rest.rpartition(":")
                bucket.queue_depth[(model, tier)] = value
        return bucket


def series_buckets(*, seconds: int, now: float | None = None) -> list[SeriesBucket]:
    """Every bucket of the last `seconds`, oldest first, the current (partial) one last."""
    now = time.time() if now is None else now
    last = bucket_start(now)
    starts = list(range(last - (math.ceil(seconds / BUCKET_S) - 1) * BUCKET_S, last + 1, BUCKET_S))
    with sync_redis().pipeline(transaction=False) as pipe:
        for start in starts:
            pipe.hgetall(keys.series_bucket(start))
        replies = pipe.execute()
    return [SeriesBucket.from_hash(start, values) for start, values in zip(starts, replies, strict=True)]


def merged_bins(bins: Iterable[Counter[int]]) -> Counter[int]:
    total: Counter[int] = Counter()
    for counter in bins:
        total.update(counter)
    return total
