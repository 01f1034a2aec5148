"""Token buckets in Redis: every bucket a request touches is checked and charged in one script.

A request passes only if every bucket has a token; otherwise nothing is charged and the caller
learns how long until the emptiest bucket refills (an honest `Retry-After`).
"""

from dataclasses import dataclass

from scheduler.redis import sync_script

_TAKE_ALL = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1000000
local cost = tonumber(ARGV[1])
local levels = {}
local wait, limiting = 0, 0
for i = 1, #KEYS do
  local capacity = tonumber(ARGV[2 * i])
  local rate = tonumber(ARGV[2 * i + 1])
  local state = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  local tokens = tonumber(state[1]) or capacity
  local ts = tonumber(state[2]) or t
  tokens = math.min(capacity, tokens + math.max(0, t - ts) * rate)
  levels[i] = tokens
  if tokens < cost then
    local bucket_wait = 3600
    if rate > 0 then bucket_wait = (cost - tokens) / rate end
    if bucket_wait > wait then wait, limiting = bucket_wait, i end
  end
end
if limiting > 0 then return {0, tostring(wait), limiting} end
for i = 1, #KEYS do
  local capacity = tonumber(ARGV[2 * i])
  local rate = tonumber(ARGV[2 * i + 1])
  redis.call('HSET', KEYS[i], 'tokens', tostring(levels[i] - cost), 'ts', tostring(t))
  local ttl = 3600
  if rate > 0 then ttl = math.ceil(capacity / rate) + 60 end
  redis.call('EXPIRE', KEYS[i], ttl)
end
return {1, '0', 0}
"""


@dataclass(frozen=True, slots=True)
class Bucket:
    key: str
    name: str  # what the refusal reports: "user", "tier", "global"
    capacity: float
    refill_per_s: float


@dataclass(frozen=True, slots=True)
class BucketDecision:
    allowed: bool
    retry_after_s: float
    limited_by: str | None


def buckets_take(buckets: list[Bucket], *, cost: float = 1.0) -> BucketDecision:
    script = sync_script(_TAKE_ALL)
    args: list[float] = [cost]
    for bucket in buckets:
        args += [bucket.capacity, bucket.refill_per_s]
    allowed, wait, limiting = script(keys=[b.key for b in buckets], args=args)
    if allowed:
        return BucketDecision(allowed=True, retry_after_s=0.0, limited_by=None)
    return BucketDecision(
        allowed=False, retry_after_s=float(wait), limited_by=buckets[int(limiting) - 1].name
    )
