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
-- ARGV: cost, max_inflight, request_id, lapse_s, then (capacity, refill_per_s) per bucket
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1000000
local cost = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return {-1, '0', 0} end
local levels = {}
local wait, limiting = 0, 0
for i = 2, #KEYS do
  local capacity = tonumber(ARGV[2 * i + 1])
  local rate = tonumber(ARGV[2 * i + 2])
  local state = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  local tokens = tonumber(state[1]) or capacity
  local ts = tonumber(state[2]) or t
  tokens = math.min(capacity, tokens + math.max(0, t - ts) * rate)
  levels[i] = tokens
  if tokens < cost then
    local bucket_wait = (cost - tokens) / rate
    if bucket_wait > wait then wait, limiting = bucket_wait, i - 1 end
  end
end
if limiting > 0 then return {0, tostring(wait), limiting} end
for i = 2, #KEYS do
  local capacity = tonumber(ARGV[2 * i + 1])
  local rate = tonumber(ARGV[2 * i + 2])
  redis.call('HSET', KEYS[i], 'tokens', tostring(levels[i] - cost), 'ts', tostring(t))
  redis.call('EXPIRE', KEYS[i], math.ceil(capacity / rate) + 60)
end
redis.call('ZADD', KEYS[1], t + tonumber(ARGV[4]), ARGV[3])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[4])) + 60)
return {1, '0', 0}
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
    name: str  # what a refusal reports: "user", "address", "tier", "global"
    capacity: float
    refill_per_s: float


@dataclass(frozen=True, slots=True)
class RateDecision:
    allowed: bool
    retry_after_s: float = 0.0
    limited_by: str | None = None  # a bucket's name, or "concurrency"


def rate_limit_take(
    buckets: list[Bucket],
    *,
    inflight_key: str,
    max_inflight: int,
    request_id: str,
    lapse_s: float,
    cost: float = 1.0,
) -> RateDecision:
    """Charge every bucket and record the request as unfinished (for at most `lapse_s`)."""
    args: list[object] = [cost, max_inflight, request_id, lapse_s]
    for bucket in buckets:
        args += [bucket.capacity, bucket.refill_per_s]
    allowed, wait, limiting = sync_script(_TAKE)(keys=[inflight_key, *(b.key for b in buckets)], args=args)
    if allowed == 1:
        return RateDecision(allowed=True)
    if allowed == -1:
        return RateDecision(allowed=False, limited_by="concurrency")
    return RateDecision(allowed=False, retry_after_s=float(wait), limited_by=buckets[int(limiting) - 1].name)


def rate_limit_refund(
    buckets: list[Bucket], *, inflight_key: str, request_id: str, cost: float = 1.0
) -> None:
    """Give back what an admitted request took when a later step refused it."""
    with sync_redis().pipeline(transaction=False) as pipe:
        for bucket in buckets:
            pipe.hincrbyfloat(bucket.key, "tokens", cost)
        pipe.zrem(inflight_key, request_id)
        pipe.execute()
