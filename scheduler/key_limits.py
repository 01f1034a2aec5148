"""An API key's own limits: requests and tokens per minute, set in the console.

Both are token buckets in Redis beside the tier's (capacity: the per-minute limit; refill: a
sixtieth of it a second), charged by admission's one Lua script with the other buckets. A request
takes one from the requests bucket and, from the tokens bucket, its prompt plus `max_tokens`:
what it may use at most. When the answer ends, the worker settles the reservation with what it
used (`request_settle`, through admission's `request_finished`), so a key pays for the tokens
produced, and a request is refused only while its worst case does not fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import redis.asyncio as aioredis

from scheduler import keys
from scheduler.rate_limits import Bucket
from scheduler.redis import async_script, sync_redis

REQUESTS_BUCKET = "key_requests"
TOKENS_BUCKET = "key_tokens"
KEY_BUCKETS = (REQUESTS_BUCKET, TOKENS_BUCKET)


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """A key's limits; None: unlimited. With them, its fair-share weight (None: the API's)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    fair_share_weight: float | None = None

    @property
    def any(self) -> bool:
        return self.requests_per_minute is not None or self.tokens_per_minute is not None


@dataclass(frozen=True, slots=True)
class LimitLevel:
    """One limit as the x-ratelimit headers report it."""

    limit: int
    remaining: int
    reset_s: float  # until the bucket is full again


@dataclass(frozen=True, slots=True)
class KeyLimitState:
    requests: LimitLevel | None
    tokens: LimitLevel | None


def key_buckets(client_id: str, limits: KeyLimits, *, tokens: int) -> list[Bucket]:
    """The key's buckets, for admission to charge; `tokens` is the request's reservation."""
    buckets = []
    if limits.requests_per_minute is not None:
        rpm = limits.requests_per_minute
        buckets.append(Bucket(keys.bucket_key_requests(client_id), REQUESTS_BUCKET, rpm, rpm / 60))
    if limits.tokens_per_minute is not None:
        tpm = limits.tokens_per_minute
        buckets.append(Bucket(keys.bucket_key_tokens(client_id), TOKENS_BUCKET, tpm, tpm / 60, cost=tokens))
    return buckets


def _level(bucket: Bucket, tokens: float) -> LimitLevel:
    return LimitLevel(
        limit=int(bucket.capacity),
        remaining=max(0, math.floor(tokens)),
        reset_s=max(0.0, (bucket.capacity - tokens) / bucket.refill_per_s),
    )


def key_limit_state(buckets: list[Bucket], levels: dict[str, float]) -> KeyLimitState:
    """The state of the key's buckets at these levels (bucket key -> level)."""
    by_name = {bucket.name: _level(bucket, levels[bucket.key]) for bucket in buckets if bucket.key in levels}
    return KeyLimitState(requests=by_name.get(REQUESTS_BUCKET), tokens=by_name.get(TOKENS_BUCKET))


def key_limit_peek(client_id: str, limits: KeyLimits) -> KeyLimitState:
    """The key's buckets now, charging nothing (for answers that admit no generation)."""
    buckets = key_buckets(client_id, limits, tokens=0)
    client = sync_redis()
    with client.pipeline(transaction=False) as pipe:
        pipe.time()
        for bucket in buckets:
            pipe.hmget(bucket.key, "tokens", "ts")
        (seconds, micros), *states = pipe.execute()
    now = seconds + micros / 1_000_000
    levels = {}
    for bucket, (tokens, ts) in zip(buckets, states, strict=True):
        level = bucket.capacity if tokens is None else float(tokens)
        elapsed = now - float(ts) if ts is not None else 0.0
        levels[bucket.key] = min(bucket.capacity, level + max(0.0, elapsed) * bucket.refill_per_s)
    return key_limit_state(buckets, levels)


_FINISH = """
-- KEYS: inflight set, token reservations, tokens bucket. ARGV: request_id, tokens used
redis.call('ZREM', KEYS[1], ARGV[1])
local reserved = tonumber(redis.call('HGET', KEYS[2], ARGV[1]))
if reserved == nil then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
-- An expired bucket is full: there is nothing to give back, and no debt worth keeping.
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HINCRBYFLOAT', KEYS[3], 'tokens', reserved - tonumber(ARGV[2]))
end
return 1
"""


async def request_settle(
    client: aioredis.Redis, *, client_id: str, limits_client_id: str, request_id: str, tokens_used: int
) -> None:
    """Take the request off its client's unfinished ones and settle its key's reservation (the
    key `limits_client_id`): the tokens bucket gets back what was reserved beyond `tokens_used`
    (or pays what was used beyond it). Idempotent: a reservation is settled once, so a retried
    call changes nothing."""
    await async_script(client, _FINISH)(
        keys=[
            keys.inflight(client_id),
            keys.key_token_reservations(limits_client_id),
            keys.bucket_key_tokens(limits_client_id),
        ],
        args=[request_id, tokens_used],
    )
