"""Rate limits in Redis, decided in Lua within one script call per request: the enqueue
script's (scheduler.queues), which charges and queues a request in one step, or this module's
own for a request that is not queued (an answer from the result cache).

A request passes only if the client has room for another unfinished request and every token
bucket it touches (client, address, tier, global, an API key's own) has a token; otherwise
nothing is charged and the caller learns how long until the emptiest bucket refills (an honest
Retry-After).
"""

import ipaddress
from dataclasses import dataclass

from scheduler.redis import sync_script

# The rate limit of one request, as functions that admission's scripts share (this module's
# own, and the enqueue script that charges a request and queues it in one step).
# KEYS from index k: the client's inflight set, its n buckets, then (optional) a hash that notes
# what the request reserved. ARGV from index a: n, max_inflight, request_id, lapse_s, then
# (capacity, refill_per_s, cost) per bucket, then the reserved amount when there is that hash.
RATE_LIMIT_LUA = """
local function rate_limit_check(t, k, a)
  -- {allowed, wait, limiting bucket (1-based)} and every bucket's level before any charge;
  -- allowed -1: over the concurrency limit (no bucket read).
  redis.call('ZREMRANGEBYSCORE', KEYS[k], '-inf', t)
  if redis.call('ZCARD', KEYS[k]) >= tonumber(ARGV[a + 1]) then return {-1, '0', 0}, {} end
  local levels = {}
  local wait, limiting = 0, 0
  for i = 1, tonumber(ARGV[a]) do
    local base = a + 1 + 3 * i
    local capacity = tonumber(ARGV[base])
    local rate = tonumber(ARGV[base + 1])
    local cost = tonumber(ARGV[base + 2])
    local state = redis.call('HMGET', KEYS[k + i], 'tokens', 'ts')
    local tokens = tonumber(state[1]) or capacity
    local ts = tonumber(state[2]) or t
    tokens = math.min(capacity, tokens + math.max(0, t - ts) * rate)
    levels[i] = tokens
    if tokens < cost then
      local bucket_wait = (cost - tokens) / rate
      if bucket_wait > wait then wait, limiting = bucket_wait, i end
    end
  end
  if limiting > 0 then return {0, tostring(wait), limiting}, levels end
  return {1, '0', 0}, levels
end
local function rate_limit_charge(t, k, a, levels)
  -- Take each bucket's cost (levels become the levels after it) and count the request in progress.
  local n = tonumber(ARGV[a])
  for i = 1, n do
    local base = a + 1 + 3 * i
    local capacity = tonumber(ARGV[base])
    local rate = tonumber(ARGV[base + 1])
    levels[i] = levels[i] - tonumber(ARGV[base + 2])
    redis.call('HSET', KEYS[k + i], 'tokens', tostring(levels[i]), 'ts', tostring(t))
    redis.call('EXPIRE', KEYS[k + i], math.ceil(capacity / rate) + 60)
  end
  local lapse_s = tonumber(ARGV[a + 3])
  redis.call('ZADD', KEYS[k], t + lapse_s, ARGV[a + 2])
  redis.call('EXPIRE', KEYS[k], math.ceil(lapse_s) + 60)
  local reservations = KEYS[k + n + 1]
  if reservations then
    redis.call('HSET', reservations, ARGV[a + 2], ARGV[a + 4 + 3 * n])
    redis.call('EXPIRE', reservations, math.ceil(lapse_s) + 60)
  end
end
local function rate_limit_reply(decision, levels)
  for i = 1, #levels do decision[3 + i] = tostring(levels[i]) end
  return decision
end
"""

_TAKE = (
    RATE_LIMIT_LUA
    + """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1000000
local decision, levels = rate_limit_check(t, 1, 1)
if decision[1] == 1 then rate_limit_charge(t, 1, 1, levels) end
return rate_limit_reply(decision, levels)
"""
)


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


@dataclass(frozen=True, slots=True)
class RateCharge:
    """What admitting one request takes: each bucket's cost, and a place among its client's
    unfinished requests (for at most `lapse_s`). `reservation`: a hash in which to note, under the
    request's id, an amount it reserved (an API key's tokens), with the same lapse."""

    buckets: tuple[Bucket, ...]
    inflight_key: str
    max_inflight: int
    request_id: str
    lapse_s: float
    reservation: tuple[str, float] | None = None

    def script_keys(self) -> list[str]:
        """KEYS of RATE_LIMIT_LUA's functions, in their order."""
        reservation_key = [self.reservation[0]] if self.reservation else []
        return [self.inflight_key, *(bucket.key for bucket in self.buckets), *reservation_key]

    def script_args(self) -> list[object]:
        """ARGV of RATE_LIMIT_LUA's functions, in their order."""
        args: list[object] = [len(self.buckets), self.max_inflight, self.request_id, self.lapse_s]
        for bucket in self.buckets:
            args += [bucket.capacity, bucket.refill_per_s, bucket.cost]
        if self.reservation:
            args.append(self.reservation[1])
        return args

    def decision(self, reply: list) -> RateDecision:
        """The decision of the scripts' `rate_limit_reply`."""
        allowed, wait, limiting, *levels = reply
        if allowed == -1:
            return RateDecision(allowed=False, limited_by="concurrency")
        bucket_levels = tuple(float(level) for level in levels)
        if allowed == 1:
            return RateDecision(allowed=True, levels=bucket_levels)
        return RateDecision(
            allowed=False,
            retry_after_s=float(wait),
            limited_by=self.buckets[int(limiting) - 1].name,
            levels=bucket_levels,
        )


_REFUND = """
-- KEYS: the client's inflight set, its n buckets, then (optional) the reservations hash.
-- ARGV: n, request_id, then each bucket's cost.
local n = tonumber(ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[2])
for i = 1, n do
  -- An expired bucket is full: there is nothing to give back. A level over the capacity is
  -- read as the capacity.
  if redis.call('EXISTS', KEYS[1 + i]) == 1 then
    redis.call('HINCRBYFLOAT', KEYS[1 + i], 'tokens', ARGV[2 + i])
  end
end
if KEYS[n + 2] then redis.call('HDEL', KEYS[n + 2], ARGV[2]) end
return 1
"""


def rate_limit_refund(charge: RateCharge) -> None:
    """Give back what `charge` took when it was admitted: every bucket's cost, the place among
    the client's unfinished requests and the reservation, which is then no longer settled."""
    reservation_key = [charge.reservation[0]] if charge.reservation else []
    sync_script(_REFUND)(
        keys=[charge.inflight_key, *(bucket.key for bucket in charge.buckets), *reservation_key],
        args=[len(charge.buckets), charge.request_id, *(bucket.cost for bucket in charge.buckets)],
    )


def rate_limit_take(charge: RateCharge) -> RateDecision:
    """Charge the request, or nothing when a limit refuses it."""
    return charge.decision(sync_script(_TAKE)(keys=charge.script_keys(), args=charge.script_args()))
