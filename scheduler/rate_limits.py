"""Rate limits in Redis, decided in one Lua script per request.

A request passes only if the client has room for another unfinished request and every token
bucket it touches (client, address, tier, global) has a token; otherwise nothing is charged
and the caller learns how long until the emptiest bucket refills (an honest Retry-After).
"""

import ipaddress
from dataclasses import dataclass

from scheduler.redis import sync_redis, sync_script

_TAKE = """
-- KEYS: inflight set, then the buckets
-- ARGV: max_inflight, request_id, lapse_s, then (capacity, refill_per_s, cost) per bucket
-- Returns {allowed, wait, limiting bucket (1-based), then each bucket's level}: levels after the
-- charge when allowed (1), before it when a bucket refused (0); -1: over the concurrency limit.
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return {-1, '0', 0} end
local levels = {}
local wait, limiting = 0, 0
for i = 2, #KEYS do
  local base = 3 * i - 2
  local capacity = tonumber(ARGV[base])
  local rate = tonumber(ARGV[base + 1])
  local cost = tonumber(ARGV[base + 2])
  local state = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  local tokens = tonumber(state[1]) or capacity
  local ts = tonumber(state[2]) or t
  tokens = math.min(capacity, tokens + math.max(0, t - ts) * rate)
  levels[i - 1] = tokens
  if tokens < cost then
    local bucket_wait = (cost - tokens) / rate
    if bucket_wait > wait then wait, limiting = bucket_wait, i - 1 end
  end
end
local result = {1, tostring(wait), limiting}
if limiting > 0 then
  result[1] = 0
else
  for i = 2, #KEYS do
    local base = 3 * i - 2
    local capacity = tonumber(ARGV[base])
    local rate = tonumber(ARGV[base + 1])
    levels[i - 1] = levels[i - 1] - tonumber(ARGV[base + 2])
    redis.call('HSET', KEYS[i], 'tokens', tostring(levels[i - 1]), 'ts', tostring(t))
    redis.call('EXPIRE', KEYS[i], math.ceil(capacity / rate) + 60)
  end
  redis.call('ZADD', KEYS[1], t + tonumber(ARGV[3]), ARGV[2])
  redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3])) + 60)
end
for i = 1, #levels do result[3 + i] = tostring(levels[i]) end
return result
"""


def address_scope(address: str) -> str:
    """The addresses one client controls, for per-address limits: an IPv4 address, or the /64 an
    IPv6 address lies in (one subscriber's usual allocation: any address in it is theirs to use)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


@dataclass(frozen=True, slots=True)
class Bucket:
    key: str
    name: str  # what a refusal reports: "user", "address", "tier", "global", "key_requests"...
    capacity: float
    refill_per_s: float
    cost: float = 1.0  # what one request takes from it (a token bucket's tokens: more than one)


@dataclass(frozen=True, slots=True)
class RateDecision:
    allowed: bool
    retry_after_s: float = 0.0
    limited_by: str | None = None  # a bucket's name, or "concurrency"
    # Each bucket's level, in the order given: after the charge when allowed, before it when a
    # bucket refused; empty when the concurrency limit refused (no bucket was read).
    levels: tuple[float, ...] = ()


def rate_limit_take(
    buckets: list[Bucket],
    *,
    inflight_key: str,
    max_inflight: int,
    request_id: str,
    lapse_s: float,
) -> RateDecision:
    """Charge every bucket its cost and record the request as unfinished (for at most `lapse_s`)."""
    args: list[object] = [max_inflight, request_id, lapse_s]
    for bucket in buckets:
        args += [bucket.capacity, bucket.refill_per_s, bucket.cost]
    allowed, wait, limiting, *levels = sync_script(_TAKE)(
        keys=[inflight_key, *(b.key for b in buckets)], args=args
    )
    if allowed == -1:
        return RateDecision(allowed=False, limited_by="concurrency")
    bucket_levels = tuple(float(level) for level in levels)
    if allowed == 1:
        return RateDecision(allowed=True, levels=bucket_levels)
    return RateDecision(
        allowed=False,
        retry_after_s=float(wait),
        limited_by=buckets[int(limiting) - 1].name,
        levels=bucket_levels,
    )


def rate_limit_refund(buckets: list[Bucket], *, inflight_key: str, request_id: str) -> None:
    """Give back what an admitted request took when a later step refused it."""
    with sync_redis().pipeline(transaction=False) as pipe:
        for bucket in buckets:
            pipe.hincrbyfloat(bucket.key, "tokens", bucket.cost)
        pipe.zrem(inflight_key, request_id)
        pipe.execute()
