"""Durable job queues: one Redis stream per (model, tier), read through a consumer group.

Enqueue is one Lua script that checks the request's rate limit (scheduler.rate_limits), the
queue bound and the predicted wait (Little's law: jobs ahead / drain rate) and, when all pass,
charges the rate limit, adds the job and its `queued` result event atomically, and counts it in
the tier's arrival rate (the autoscaling signal reads it): admission is one round trip.
Workers claim in priority order, renew leases on what they run, and take over jobs whose lease
expired (a dead worker's) until a job has used its attempts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings

from scheduler import fair_share, keys
from scheduler.control import request_cancel
from scheduler.fair_share import FairShare
from scheduler.generation import GenerationJob, Tier
from scheduler.rate_limits import RATE_LIMIT_LUA, RateCharge, RateDecision
from scheduler.redis import NotReplicated, async_script, script_replicated, sync_redis, sync_script

logger = logging.getLogger(__name__)

MIN_DRAIN_RATE = 0.2  # jobs/s assumed while no live worker reports its capacity
# Admitted jobs are counted per tier in buckets this wide; a rate is read over whole buckets.
ARRIVAL_BUCKET_S = 5
# With fair share, each claim sorts at most this many new jobs of a tier into their sources'
# backlogs: a burst of thousands is sorted over a few claims, none holding Redis long.
SORT_IN_PER_CALL = 500

# The drain rate of a tier is the sum of what live workers report they can finish per second
# (their slots / their measured mean service time): it holds through idle spells and bursts,
# where a count of recent claims would read near zero just when a burst arrives.
_LUA_COMMON = """
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function queued(enqueued_key, claimed_key)
  return (tonumber(redis.call('GET', enqueued_key)) or 0)
       - (tonumber(redis.call('GET', claimed_key)) or 0)
end
local function drain_rate(capacity_key, tier, t, stale_s, floor)
  local total = 0
  local entries = redis.call('HGETALL', capacity_key)
  for i = 1, #entries, 2 do
    local all, normal, ts = string.match(entries[i + 1], '^([^|]+)|([^|]+)|([^|]+)$')
    if ts and t - tonumber(ts) <= stale_s then
      if tier == 'vip' then total = total + tonumber(all) else total = total + tonumber(normal) end
    end
  end
  return math.max(total, floor)
end
-- Jobs ahead of a new one: its own tier's queue plus every higher tier's (KEYS from
-- first_higher to last_higher).
local function ahead(own_enqueued, own_claimed, first_higher, last_higher)
  local n = queued(own_enqueued, own_claimed)
  for i = first_higher, last_higher, 2 do n = n + queued(KEYS[i], KEYS[i + 1]) end
  return n
end
"""

_ENQUEUE = (
    _LUA_COMMON
    + RATE_LIMIT_LUA
    + """
-- KEYS: queue, enqueued, claimed, capacity, result, arrivals, then (enqueued, claimed) of each
--       higher tier, then the rate limit's keys when the request is charged here
-- ARGV: max_queued, wait_slo_s, stale_s, min_rate, result_ttl_s, tier, request_id, job,
--       max_wait_s, arrivals_ttl_s, number of higher tiers, the job's fair-share source, weight
--       and charge at claim, its conversation ('' for none), then the rate limit's arguments
-- Returns {admitted, queued, wait, entry id or refusal, the rate limit's reply ({}: not
-- charged)}. Every check comes before any write, so a refusal charges nothing.
local t = now()
local charged = 7 + 2 * tonumber(ARGV[11])
local decision, levels = {}, {}
if #KEYS >= charged then
  decision, levels = rate_limit_check(t, charged, 16)
  if decision[1] ~= 1 then return {0, 0, '0', 'rate_limited', rate_limit_reply(decision, levels)} end
end
local own = queued(KEYS[2], KEYS[3])
local wait = ahead(KEYS[2], KEYS[3], 7, charged - 1)
  / drain_rate(KEYS[4], ARGV[6], t, tonumber(ARGV[3]), tonumber(ARGV[4]))
if own >= tonumber(ARGV[1]) then return {0, own, tostring(wait), 'queue_full', {}} end
if wait > tonumber(ARGV[2]) then return {0, own, tostring(wait), 'wait_over_slo', {}} end
if #KEYS >= charged then rate_limit_charge(t, charged, 16, levels) end
local seq = redis.call('INCR', KEYS[2])
local id = redis.call('XADD', KEYS[1], '*', 'seq', seq, 'enqueued_at', tostring(t),
                      'deadline', tostring(t + tonumber(ARGV[9])), 'request_id', ARGV[7],
                      'job', ARGV[8], 'source', ARGV[12], 'weight', ARGV[13], 'cost', ARGV[14],
                      'affinity', ARGV[15])
redis.call('XADD', KEYS[5], '*', 'type', 'queued', 'data', cjson.encode({seq = seq, tier = ARGV[6]}))
redis.call('EXPIRE', KEYS[5], tonumber(ARGV[5]))
redis.call('INCR', KEYS[6])
redis.call('EXPIRE', KEYS[6], tonumber(ARGV[10]))
return {1, own + 1, tostring(wait), id, rate_limit_reply(decision, levels)}
"""
)

_CLAIM = (
    fair_share.LUA
    + """
-- KEYS: per tier, in priority order: queue, claimed, fair counters, fair active, fair floor;
--       then the model's serving workers (affinity)
-- ARGV: group, consumer, total (free slots), aged tier index (0-based, -1 for none), aging_s,
--       fair share (1/0), the backlog's consumer, idle credit, most to sort in per tier and
--       call, the source a job must be under the share of ('' for any), the affinity keys'
--       prefix, how long a job is left to its conversation's worker (s, 0: never), how long
--       a conversation remembers it (s), a serving worker's heartbeat lifetime (s), how long a
--       job taken to pause an answer of ARGV[10]'s must have waited since it was queued (s),
--       then per tier: the most to take, its backlogs' key prefix; last, the most counters kept
--       per tier
local out = {}
local group, consumer = ARGV[1], ARGV[2]
local left = tonumber(ARGV[3])
local fair = ARGV[6] == '1'
local backlog_consumer, credit = ARGV[7], tonumber(ARGV[8])
local tiers = (#KEYS - 1) / 5
local serving_key = KEYS[#KEYS]
local affinity_prefix, affinity_wait = ARGV[11], tonumber(ARGV[12])
local affinity_ttl, serving_stale_s = tonumber(ARGV[13]), tonumber(ARGV[14])
local kept = tonumber(ARGV[#ARGV])
local clock = redis.call('TIME')
local t = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local function key(i, n) return KEYS[5 * i + n] end
local function fields_of(f)
  local m = {}
  for j = 1, #f, 2 do m[f[j]] = f[j + 1] end
  return m
end
-- Fair share: the tier's new jobs go to the backlog consumer, each onto its source's backlog;
-- a source that starts waiting joins the active ones.
local function sort_in(i)
  local res = redis.call('XREADGROUP', 'GROUP', group, backlog_consumer, 'COUNT', ARGV[9],
                         'STREAMS', key(i, 1), '>')
  if not res then return end
  for _, entry in ipairs(res[1][2]) do
    local source = fields_of(entry[2])['source'] or entry[1]
    if redis.call('RPUSH', ARGV[17 + 2 * i] .. source, entry[1]) == 1 then
      local start = fair_start(key(i, 3), key(i, 4), key(i, 5), source, credit)
      redis.call('ZADD', key(i, 4), start, source)
    end
  end
end
-- Up to `count` jobs of tier i, each the next of the waiting source served least.
local over = ARGV[10]
local function counter_of(i, source)
  return tonumber(redis.call('ZSCORE', key(i, 4), source))
         or tonumber(redis.call('ZSCORE', key(i, 3), source))
end
-- Affinity: the conversation of entry `id` of tier i, and whether the entry is left a while
-- for another worker, the one that answered the conversation's latest turn: only while that
-- worker serves (heartbeats, neither draining nor a spare) and the entry has waited less
-- than affinity_wait.
local function conversation_of(i, id)
  local entry = redis.call('XRANGE', key(i, 1), id, id)
  if #entry == 0 then return nil end
  local conversation = fields_of(entry[1][2])['affinity']
  if conversation == '' then return nil end
  return conversation
end
local function left_for_another(i, id)
  if affinity_wait <= 0 or not id then return false end
  local conversation = conversation_of(i, id)
  if not conversation then return false end
  local owner = redis.call('GET', affinity_prefix .. conversation)
  if not owner or owner == consumer then return false end
  local seen = tonumber(redis.call('ZSCORE', serving_key, owner))
  if not seen or t - seen > serving_stale_s then return false end
  return t - tonumber(string.match(id, '^(%d+)')) / 1000 < affinity_wait
end
-- Taken to pause an answer for, a job must have waited `preempt_after` since it was queued
-- (its entry id is the enqueue's Redis time): one that would get a slot turning over soon
-- pauses nothing, and the paused answer's prompt and streamed text are not prefilled again.
local preempt_after = tonumber(ARGV[15])
local function within_grace(id)
  if over == '' or preempt_after <= 0 or not id then return false end
  return t - tonumber(string.match(id, '^(%d+)')) / 1000 < preempt_after
end
-- The waiting source served least whose next job this worker may take now, or nil.
local AFFINITY_LOOK = 16  -- sources looked at past those whose next job is not taken now
local function next_source(i)
  local sources = redis.call('ZRANGE', key(i, 4), 0, AFFINITY_LOOK - 1, 'WITHSCORES')
  for j = 1, #sources, 2 do
    local head = redis.call('LINDEX', ARGV[17 + 2 * i] .. sources[j], 0)
    if not left_for_another(i, head) and not within_grace(head) then
      return sources[j], tonumber(sources[j + 1])
    end
  end
  return nil
end
local function take_fair(i, count)
  local taken = 0
  while taken < count do
    local source, counter = next_source(i)
    if not source then break end
    -- Taken to pause an answer of `over` for: only a source served less than it.
    if over ~= '' and (source == over or counter >= (counter_of(i, over) or -math.huge)) then
      break
    end
    local backlog = ARGV[17 + 2 * i] .. source
    local id = redis.call('LPOP', backlog)
    -- Only an entry the backlog still holds: one handed to a worker otherwise is not taken.
    if id and #redis.call('XPENDING', key(i, 1), group, id, id, 1, backlog_consumer) > 0 then
      local claimed = redis.call('XCLAIM', key(i, 1), group, consumer, 0, id, 'RETRYCOUNT', 1)
      local entry = claimed[1]
      if entry and entry[2] then
        local f = fields_of(entry[2])
        fair_charge(key(i, 3), key(i, 4), source, tonumber(f['cost'] or 0) / tonumber(f['weight'] or 1))
        if f['affinity'] and f['affinity'] ~= '' then
          redis.call('SET', affinity_prefix .. f['affinity'], consumer, 'EX', affinity_ttl)
        end
        out[#out + 1] = {i, entry[1], entry[2]}
        taken = taken + 1
      end
    end
    if redis.call('LLEN', backlog) == 0 then fair_leave(key(i, 3), key(i, 4), key(i, 5), source) end
  end
  fair_tidy(key(i, 3), key(i, 4), key(i, 5), credit, kept)
  if taken > 0 then redis.call('INCRBY', key(i, 2), taken) end
  return taken
end
-- Arrival order: the tier's next jobs.
local function take_in_order(i, count)
  local res = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', count,
                         'STREAMS', key(i, 1), '>')
  if not res then return 0 end
  local entries = res[1][2]
  local top = tonumber(redis.call('GET', key(i, 2))) or 0
  for _, entry in ipairs(entries) do
    local seq = tonumber(fields_of(entry[2])['seq'])
    if seq > top then top = seq end
    out[#out + 1] = {i, entry[1], entry[2]}
  end
  redis.call('SET', key(i, 2), top)
  return #entries
end
-- The id of the tier's oldest job not yet claimed, or nil.
local function oldest_waiting(i)
  if fair then
    local pending = redis.call('XPENDING', key(i, 1), group, '-', '+', 1, backlog_consumer)
    if #pending > 0 then return pending[1][1] end
    return nil
  end
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', key(i, 1))) do
    local info = fields_of(g)
    if info['name'] == group then
      local nxt = redis.call('XRANGE', key(i, 1), '(' .. info['last-delivered-id'], '+', 'COUNT', 1)
      if #nxt > 0 then return nxt[1][1] end
    end
  end
  return nil
end
local order = {}
for i = 0, tiers - 1 do
  order[#order + 1] = i
  if fair and tonumber(ARGV[16 + 2 * i]) > 0 then sort_in(i) end
end
-- Aging: when the aged tier's oldest job has waited past aging_s, that tier goes first.
local aged = tonumber(ARGV[4])
if aged >= 0 then
  local id = oldest_waiting(aged)
  if id then
    local now = redis.call('TIME')
    local enqueued_ms = tonumber(string.match(id, '^(%d+)'))
    if tonumber(now[1]) * 1000 + tonumber(now[2]) / 1000 - enqueued_ms > tonumber(ARGV[5]) * 1000 then
      table.remove(order, aged + 1)
      table.insert(order, 1, aged)
    end
  end
end
for _, i in ipairs(order) do
  local count = math.min(tonumber(ARGV[16 + 2 * i]), left)
  if count > 0 then
    if fair then left = left - take_fair(i, count) else left = left - take_in_order(i, count) end
  end
end
return out
"""
)

_RECORD_CLAIM = (
    fair_share.LUA
    + """
-- A job claimed by a blocking read (its tier had nothing waiting) moves its tier's claimed
-- counter and, with fair share, is charged to its source (with none waiting, it is the last to
-- leave: the floor rises to its counter) and remembered as its conversation's worker (only the
-- fair claim reads that).
-- KEYS: claimed, fair counters, fair active, fair floor, the conversation's affinity ('' none)
-- ARGV: seq, fair share (1/0), source, charge, idle credit, consumer, affinity lifetime (s),
--       most counters kept
if ARGV[2] == '1' then
  if KEYS[5] ~= '' then redis.call('SET', KEYS[5], ARGV[6], 'EX', tonumber(ARGV[7])) end
  redis.call('INCR', KEYS[1])
  fair_start(KEYS[2], KEYS[3], KEYS[4], ARGV[3], tonumber(ARGV[5]))
  fair_charge(KEYS[2], KEYS[3], ARGV[3], ARGV[4])
  if redis.call('ZCARD', KEYS[3]) == 0 then
    fair_last_left(KEYS[4], redis.call('ZSCORE', KEYS[2], ARGV[3]))
  end
  fair_tidy(KEYS[2], KEYS[3], KEYS[4], tonumber(ARGV[5]), tonumber(ARGV[8]))
  return 1
end
local top = tonumber(redis.call('GET', KEYS[1])) or 0
if tonumber(ARGV[1]) > top then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
"""
)

_QUEUE_STATE = (
    _LUA_COMMON
    + """
-- KEYS: enqueued, claimed, capacity, then (enqueued, claimed) of higher tiers
-- ARGV: tier, stale_s, min_rate
local rate = drain_rate(KEYS[3], ARGV[1], now(), tonumber(ARGV[2]), tonumber(ARGV[3]))
return {queued(KEYS[1], KEYS[2]), ahead(KEYS[1], KEYS[2], 4, #KEYS), tostring(rate)}
"""
)


_FORGET_DEAD_WORKERS = (
    _LUA_COMMON
    + """
-- KEYS: capacity, then each tier's queue; ARGV: group, stale_s
-- A worker is dead when its capacity report is missing or stale. Deleting a consumer that holds
-- no pending job loses nothing (a live one is recreated by its next read); one that holds jobs
-- stays until they are taken over, since deleting it would make them unclaimable.
local t = now()
local stale_s = tonumber(ARGV[2])
local reported = {}
local reports = redis.call('HGETALL', KEYS[1])
for i = 1, #reports, 2 do
  reported[reports[i]] = tonumber(string.match(reports[i + 1], '|([^|]+)$')) or 0
end
local function dead(name)
  local ts = reported[name]
  return ts == nil or t - ts > stale_s
end
local holding, idle = {}, {}
for i = 2, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    for _, consumer in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[i], ARGV[1])) do
      local info = {}
      for j = 1, #consumer, 2 do info[consumer[j]] = consumer[j + 1] end
      if info['pending'] > 0 then
        holding[info['name']] = true
      else
        idle[#idle + 1] = {KEYS[i], info['name']}
      end
    end
  end
end
local removed = 0
for _, entry in ipairs(idle) do
  if dead(entry[2]) and not holding[entry[2]] then
    redis.call('XGROUP', 'DELCONSUMER', entry[1], ARGV[1], entry[2])
    removed = removed + 1
  end
end
for name, _ in pairs(reported) do
  if dead(name) and not holding[name] then redis.call('HDEL', KEYS[1], name) end
end
return removed
"""
)


def _higher_tier_keys(model: str, tier: str) -> list[str]:
    higher: list[str] = []
    for other in keys.TIERS[: keys.TIERS.index(tier)]:
        higher += [keys.enqueue_seq(model, other), keys.claimed_seq(model, other)]
    return higher


@dataclass(frozen=True, slots=True)
class Job:
    """A queue entry: the generation job, where it queued, and when (by Redis's clock)."""

    entry_id: str
    model: str
    tier: str  # the queue it was in (all normal when priority scheduling is off)
    request_id: str
    seq: int
    enqueued_at: float
    deadline: float  # a job still queued at this unix time has expired
    generation: GenerationJob
    share: FairShare  # its source, weight and charge at claim, stamped at enqueue
    attempt: int = 1

    @classmethod
    def from_entry(cls, model: str, tier: str, entry_id: str, fields: Any, attempt: int = 1) -> Job:
        if isinstance(fields, list):  # raw Lua reply: [k1, v1, k2, v2, ...]
            fields = dict(zip(fields[::2], fields[1::2], strict=True))
        return cls(
            entry_id=entry_id,
            model=model,
            tier=tier,
            request_id=fields["request_id"],
            seq=int(fields["seq"]),
            enqueued_at=float(fields["enqueued_at"]),
            deadline=float(fields["deadline"]),
            generation=GenerationJob.decode(fields["job"]),
            share=FairShare(
                source=fields.get("source", entry_id),
                weight=float(fields.get("weight", 1.0)),
                cost=float(fields.get("cost", 0)),
            ),
            attempt=attempt,
        )


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    admitted: bool
    position: int  # 1 = next to be claimed (when admitted); queued jobs ahead (when refused)
    predicted_wait_s: float
    refusal: str | None = None  # "rate_limited" | "queue_full" | "wait_over_slo"
    # The rate limit's decision when the job was charged with its enqueue: refused, or allowed
    # with its buckets' levels after the charge. None when it was refused for the queue's sake
    # (nothing charged) or not charged here.
    rate: RateDecision | None = None


@dataclass(frozen=True, slots=True)
class QueueState:
    queued: int
    predicted_wait_s: float
    drain_rate_per_s: float


def job_enqueue(
    *,
    tier: str,
    job: GenerationJob,
    max_queued: int,
    wait_slo_s: float,
    max_wait_s: float,
    charge: RateCharge | None = None,
    share: FairShare | None = None,
) -> EnqueueResult:
    """Queue the job unless its tier's queue is full or its predicted wait is over the SLO.
    With `charge`, the job's rate limit is decided and charged in the same script call: one
    round trip admits a request, and a refusal, by the rate limit or the queue, charges nothing.
    `share` is the job's fair share (admission's; by default weight 1)."""
    model, request_id = job.model, job.request_id
    share = share or FairShare.of(job)
    higher = _higher_tier_keys(model, tier)
    reply, replicated = script_replicated(
        _ENQUEUE,
        keys=[
            keys.queue(model, tier),
            keys.enqueue_seq(model, tier),
            keys.claimed_seq(model, tier),
            keys.capacity(model),
            keys.result(model, request_id),
            keys.arrivals(model, tier, _arrival_bucket(time.time())),
            *higher,
            *(charge.script_keys() if charge else []),
        ],
        args=[
            max_queued,
            wait_slo_s,
            settings.WORKER_HEARTBEAT_TTL_S,
            MIN_DRAIN_RATE,
            settings.RESULT_TTL_S,
            tier,
            request_id,
            job.encode(),
            max_wait_s,
            settings.AUTOSCALE_ARRIVAL_WINDOW_S + 2 * ARRIVAL_BUCKET_S,
            len(higher) // 2,
            share.source,
            share.weight,
            share.cost,
            job.conversation_id or "",
            *(charge.script_args() if charge else []),
        ],
    )
    admitted, position, wait, detail, rate_reply = reply
    if admitted and not replicated:
        # Only the primary has the job, and a failover now would lose it: withdraw it (a worker
        # claiming it skips it) and refuse, rather than promise an answer.
        request_cancel(request_id=request_id)
        raise NotReplicated(f"the replicas did not confirm {request_id} in time")
    return EnqueueResult(
        admitted=bool(admitted),
        position=int(position),
        predicted_wait_s=float(wait),
        refusal=None if admitted else detail,
        rate=charge.decision(rate_reply) if charge and rate_reply else None,
    )


def _arrival_bucket(at: float) -> int:
    return int(at // ARRIVAL_BUCKET_S * ARRIVAL_BUCKET_S)


def arrival_rates(*, model: str, now: float | None = None) -> dict[str, float]:
    """Jobs admitted per second to each of the model's tiers, over the last
    AUTOSCALE_ARRIVAL_WINDOW_S (whole buckets, the current one up to now)."""
    now = time.time() if now is None else now
    current = _arrival_bucket(now)
    first = _arrival_bucket(now - settings.AUTOSCALE_ARRIVAL_WINDOW_S)
    starts = range(first, current + 1, ARRIVAL_BUCKET_S)
    counts = sync_redis().mget([keys.arrivals(model, tier, start) for tier in keys.TIERS for start in starts])
    elapsed_s = max(now - first, 1.0)
    per_tier = len(starts)
    return {
        tier: sum(int(n or 0) for n in counts[i * per_tier : (i + 1) * per_tier]) / elapsed_s
        for i, tier in enumerate(keys.TIERS)
    }


def _queue_state_call(model: str, tier: str) -> dict[str, list]:
    return {
        "keys": [
            keys.enqueue_seq(model, tier),
            keys.claimed_seq(model, tier),
            keys.capacity(model),
            *_higher_tier_keys(model, tier),
        ],
        "args": [tier, settings.WORKER_HEARTBEAT_TTL_S, MIN_DRAIN_RATE],
    }


def _queue_state(reply: list) -> QueueState:
    queued, ahead, rate = reply
    return QueueState(
        queued=int(queued), predicted_wait_s=int(ahead) / float(rate), drain_rate_per_s=float(rate)
    )


def queue_state(*, model: str, tier: str) -> QueueState:
    """The tier's queue as the console shows it: queued jobs, predicted wait and drain rate."""
    return _queue_state(sync_script(_QUEUE_STATE)(**_queue_state_call(model, tier)))


async def queue_state_async(client: aioredis.Redis, *, model: str, tier: str) -> QueueState:
    return _queue_state(await async_script(client, _QUEUE_STATE)(**_queue_state_call(model, tier)))


async def claimed_through(client: aioredis.Redis, *, model: str, tier: str) -> int:
    """How many of the tier's jobs were claimed (in arrival order: the sequence number of the
    latest): a job with seq n is at position n - claimed_through (1 = next). With fair share
    the claim is not in arrival order, and this position is a rough guide only."""
    return int(await client.get(keys.claimed_seq(model, tier)) or 0)


class JobQueue:
    """The worker's side of one model's queues (async; one instance per worker)."""

    def __init__(
        self, client: aioredis.Redis, *, model: str, consumer: str, fair_share: bool | None = None
    ) -> None:
        self.client = client
        self.model = model
        self.consumer = consumer
        # Fair share between sources inside each tier (scheduler/fair_share.py); off: arrival
        # order, the benchmark's baseline.
        self.fair_share = settings.FAIR_SHARE if fair_share is None else fair_share
        self._claim = async_script(client, _CLAIM)
        self._record_claim = async_script(client, _RECORD_CLAIM)
        self._recordings: set[asyncio.Future] = set()
        self._forget_dead_workers = async_script(client, _FORGET_DEAD_WORKERS)
        # The last entry seen in each tier's queue by wait_for_arrival (absent: none since the
        # last claim that took jobs).
        self._seen: dict[str, str] = {}

    async def ensure_groups(self) -> None:
        for tier in keys.TIERS:
            try:
                await self.client.xgroup_create(
                    keys.queue(self.model, tier), keys.CONSUMER_GROUP, id="0", mkstream=True
                )
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def claim(
        self,
        *,
        total: int,
        per_tier: dict[str, int],
        aging_s: float | None = None,
        under_share_of: str = "",
    ) -> list[Job]:
        """Claim up to `total` new jobs, taking tiers in the order of keys.TIERS and at most
        per_tier[tier] from each; a normal job waiting over `aging_s` goes before VIP. Inside a
        tier, with fair share, each job is the next of the waiting source served least; with
        `under_share_of` (a source), only if that source was served less than this one and
        the job has waited FAIR_SHARE_PREEMPT_AFTER_S since it was queued. A
        conversation's turn is left up to AFFINITY_WAIT_S to the serving worker that claimed
        its previous one (the sources after it go first meanwhile)."""
        tier_keys: list[str] = []
        tier_args: list[object] = []
        for tier in keys.TIERS:
            tier_keys += [
                keys.queue(self.model, tier),
                keys.claimed_seq(self.model, tier),
                keys.fair_counters(self.model, tier),
                keys.fair_active(self.model, tier),
                keys.fair_floor(self.model, tier),
            ]
            tier_args += [per_tier.get(tier, 0), keys.fair_backlog_prefix(self.model, tier)]
        reply = await self._claim(
            keys=[*tier_keys, keys.serving(self.model)],
            args=[
                keys.CONSUMER_GROUP,
                self.consumer,
                total,
                keys.TIERS.index(Tier.NORMAL) if aging_s is not None else -1,
                aging_s or 0,
                int(self.fair_share),
                keys.FAIR_SHARE_CONSUMER,
                fair_share.idle_credit(),
                SORT_IN_PER_CALL,
                under_share_of,
                keys.affinity_prefix(self.model),
                settings.AFFINITY_WAIT_S,
                settings.AFFINITY_TTL_S,
                settings.WORKER_HEARTBEAT_TTL_S,
                settings.FAIR_SHARE_PREEMPT_AFTER_S,
                *tier_args,
                settings.FAIR_SHARE_SOURCES_KEPT,
            ],
        )
        if reply:
            # Busy for a while now: the next wait starts from the newest entry then, not from
            # every entry that arrives meanwhile.
            self._seen.clear()
        return [
            Job.from_entry(self.model, keys.TIERS[int(index)], entry_id, fields)
            for index, entry_id, fields in reply
        ]

    async def wait_for_arrival(self, tiers: list[str], timeout_s: float) -> bool:
        """Wait, up to `timeout_s`, for a job to be added to one of `tiers` after the last one
        this worker saw arrive, without claiming it: every worker wakes, and the claim decides
        which one takes it (a conversation's turn goes to the worker that has its prefix).
        Whether one arrived. The first wait after a claim that took jobs starts from the newest
        entry then: one that arrived between the empty claim before it and that read waits for
        the next look (`timeout_s`), as every arrival did before this wait existed."""
        for tier in tiers:
            if tier not in self._seen:
                newest = await self.client.xrevrange(keys.queue(self.model, tier), count=1)
                self._seen[tier] = newest[0][0] if newest else "0-0"
        streams = {keys.queue(self.model, tier): self._seen[tier] for tier in tiers}
        # One entry is enough to wake: the claim that follows takes every job it may.
        reply = await self.client.xread(streams, count=1, block=max(1, int(timeout_s * 1000)))
        for stream, entries in reply or []:
            self._seen[stream.rsplit(":", 1)[1]] = entries[-1][0]
        return bool(reply)

    async def claim_blocking(self, tiers: list[str], timeout_s: float) -> list[Job]:
        """Wait for the next job on any of `tiers`; used only when the worker is idle."""
        streams = {keys.queue(self.model, tier): ">" for tier in tiers}
        reply = await self.client.xreadgroup(
            keys.CONSUMER_GROUP, self.consumer, streams, count=1, block=int(timeout_s * 1000)
        )
        jobs = []
        for stream, entries in reply or []:
            tier = stream.rsplit(":", 1)[1]
            for entry_id, fields in entries:
                job = Job.from_entry(self.model, tier, entry_id, fields)
                # The claimed counter only tells waiting clients their place: moved while the
                # job starts, not before (the job's time to first token waits for nothing).
                recording = asyncio.ensure_future(
                    self._record_claim(
                        keys=[
                            keys.claimed_seq(self.model, tier),
                            keys.fair_counters(self.model, tier),
                            keys.fair_active(self.model, tier),
                            keys.fair_floor(self.model, tier),
                            self._affinity_key(job),
                        ],
                        args=[
                            job.seq,
                            int(self.fair_share),
                            job.share.source,
                            job.share.charge(job.share.cost),
                            fair_share.idle_credit(),
                            self.consumer,
                            settings.AFFINITY_TTL_S,
                            settings.FAIR_SHARE_SOURCES_KEPT,
                        ],
                    )
                )
                self._recordings.add(recording)
                recording.add_done_callback(self._recorded)
                jobs.append(job)
        return jobs

    def _affinity_key(self, job: Job) -> str:
        conversation = job.generation.conversation_id
        return keys.affinity_prefix(self.model) + conversation if conversation else ""

    async def recordings_wait(self, timeout_s: float = 1.0) -> None:
        """Wait a moment for the claimed counters still being written (before the client
        closes); one Redis cannot take is left, the next claim's counter covering it."""
        if self._recordings:
            await asyncio.wait(set(self._recordings), timeout=timeout_s)

    def _recorded(self, recording: asyncio.Future) -> None:
        self._recordings.discard(recording)
        if not recording.cancelled() and recording.exception() is not None:
            logger.warning("recording a claim failed: %s", recording.exception())

    async def ack(self, job: Job) -> None:
        stream = keys.queue(self.model, job.tier)
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.xack(stream, keys.CONSUMER_GROUP, job.entry_id)
            pipe.xdel(stream, job.entry_id)
            await pipe.execute()

    async def renew_leases(self, jobs: list[Job]) -> None:
        """Reset the idle time of running jobs so no other worker takes them over."""
        async with self.client.pipeline(transaction=False) as pipe:
            for tier in keys.TIERS:
                ids = [job.entry_id for job in jobs if job.tier == tier]
                if ids:
                    pipe.xclaim(
                        keys.queue(self.model, tier),
                        keys.CONSUMER_GROUP,
                        self.consumer,
                        min_idle_time=0,
                        message_ids=ids,
                        justid=True,
                    )
            await pipe.execute()

    async def release(self, job: Job) -> None:
        """Hand a claimed job back (drain): mark it long idle so the next reclaim takes it,
        without counting this as a failed attempt."""
        await self.client.xclaim(
            keys.queue(self.model, job.tier),
            keys.CONSUMER_GROUP,
            self.consumer,
            min_idle_time=0,
            message_ids=[job.entry_id],
            idle=10**9,
            retrycount=max(0, job.attempt - 1),
            justid=True,
        )

    async def reclaim_expired(
        self, *, lease_s: float, max_count: int, max_attempts: int
    ) -> tuple[list[Job], list[Job]]:
        """Take over jobs whose lease expired. Returns (jobs to run, jobs out of attempts)."""
        runnable: list[Job] = []
        exhausted: list[Job] = []
        lease_ms = int(lease_s * 1000)
        for tier in keys.TIERS:
            stream = keys.queue(self.model, tier)
            pending = []
            for holder in await self._lease_holders(stream):
                pending += await self.client.xpending_range(
                    stream,
                    keys.CONSUMER_GROUP,
                    min="-",
                    max="+",
                    count=max(max_count, 1) * 4,
                    idle=lease_ms,
                    consumername=holder,
                )
            for info in pending:
                if len(runnable) >= max_count:
                    break
                claimed = await self.client.xclaim(
                    stream,
                    keys.CONSUMER_GROUP,
                    self.consumer,
                    min_idle_time=lease_ms,
                    message_ids=[info["message_id"]],
                )
                for entry_id, fields in claimed:
                    if not fields:  # deleted meanwhile
                        await self.client.xack(stream, keys.CONSUMER_GROUP, entry_id)
                        continue
                    attempt = int(info["times_delivered"]) + 1
                    job = Job.from_entry(self.model, tier, entry_id, fields, attempt=attempt)
                    (exhausted if attempt > max_attempts else runnable).append(job)
        return runnable, exhausted

    async def _lease_holders(self, stream: str) -> list[str | None]:
        """Whose pending jobs are leases that may expire: every consumer's (None), or with fair
        share every worker's but the backlog's, whose jobs wait their turn and hold no lease."""
        if not self.fair_share:
            return [None]
        if not await self.client.exists(stream):
            return []
        consumers = await self.client.xinfo_consumers(stream, keys.CONSUMER_GROUP)
        return [
            consumer["name"]
            for consumer in consumers
            if consumer["pending"] and consumer["name"] != keys.FAIR_SHARE_CONSUMER
        ]

    async def dead_workers_forget(self, *, stale_s: float) -> int:
        """Remove the consumers and capacity reports of workers that have not reported for
        `stale_s` and hold no pending job. Returns how many consumers were removed."""
        return await self._forget_dead_workers(
            keys=[keys.capacity(self.model), *(keys.queue(self.model, tier) for tier in keys.TIERS)],
            args=[keys.CONSUMER_GROUP, stale_s],
        )

    async def dead_letter(self, job: Job, reason: str) -> None:
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.xadd(
                keys.dead_letter(self.model),
                {
                    "request_id": job.request_id,
                    "tier": job.tier,
                    "reason": reason,
                    "attempts": job.attempt - 1,
                    "at": time.time(),
                },
                maxlen=10_000,
                approximate=True,
            )
            pipe.xack(keys.queue(self.model, job.tier), keys.CONSUMER_GROUP, job.entry_id)
            pipe.xdel(keys.queue(self.model, job.tier), job.entry_id)
            await pipe.execute()
