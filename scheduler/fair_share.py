"""Fair share between the sources of traffic inside a tier, by tokens served (the Virtual Token
Counter of "Fairness in Serving Large Language Models", OSDI 2024).

A job's source is set by the server from who it is for: a chat customer (a guest by their
address, as their rate limits), an API key, a batch job's owner, a quality score's variant;
nothing a client sends names it. Each source has a
counter of the tokens it was served in the tier (prompt and answer, divided by its weight): the
claim (scheduler.queues) takes the next job of the waiting source with the least. A job is
charged when it is claimed with its most (prompt and `max_tokens`; a prompt token counts
FAIR_SHARE_PROMPT_TOKEN_WEIGHT of an answer's), and settled with what it used when it ends, so
a source with many answers under way counts them while they run. A source that starts waiting
again starts no lower than the floor (the least counter of the sources waiting) less
FAIR_SHARE_IDLE_CREDIT_TOKENS: an idle spell banks at most that much. When the last waiting
source leaves (or one is served straight from the stream with none waiting), the floor rises to
its counter, so a source served alone does not bank what it was served against a newcomer. A
source alone is served at once (work-conserving).

The counters are soft state in Redis: losing them (a Redis restart without its data) only
resets every share to even; the jobs are the streams' entries, and the backlogs that order them
are written in the same script calls as the streams.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis.asyncio as aioredis
from django.conf import settings

from scheduler import keys
from scheduler.generation import GenerationJob, Origin
from scheduler.models import SourceWeight
from scheduler.rate_limits import address_scope
from scheduler.redis import async_script

# A rough count of prompt tokens from its characters: the charge at claim is corrected by the
# answer's real usage when it ends, so this needs no tokenizer.
CHARS_PER_TOKEN = 4
WEIGHTS_CACHE_S = 1.0


@dataclass(frozen=True, slots=True)
class FairShare:
    """What a queued job carries for the claim: its source, its weight, its charge at claim."""

    source: str
    weight: float
    cost: float  # counted when claimed: the most it can be served (tokens_served, unweighted)

    def charge(self, tokens: float) -> float:
        return tokens / self.weight

    @classmethod
    def of(cls, job: GenerationJob, *, weight: float = 1.0, guest_address: str | None = None) -> FairShare:
        return cls(source=job_source(job, guest_address=guest_address), weight=weight, cost=job_cost(job))


def job_source(job: GenerationJob, *, guest_address: str | None = None) -> str:
    """The source a job's share is counted for: its origin and its server-set client id (the
    conversation's customer, the API key, the batch job's owner, the quality score's variant).
    A guest (`guest_address`, admission's for guests only) counts by their address (an IPv6 one
    by its /64), as their per-address limits do: guest ids cost nothing to make, so one client
    making many would otherwise take a share with each."""
    if guest_address:
        return f"{job.origin}:address:{address_scope(guest_address)}"
    return f"{job.origin}:{job.client_id}"


def tokens_served(*, prompt_tokens: int, completion_tokens: int) -> float:
    """What an answer counts for its source before its weight: its answer's tokens, and its
    prompt's at FAIR_SHARE_PROMPT_TOKEN_WEIGHT each (VTC's w_p against w_q = 1): a prompt
    token costs the engine a fraction of a decoded one (prefilled in a batch, often found in
    the prefix cache), while a decoded one holds a slot for a step."""
    return prompt_tokens * settings.FAIR_SHARE_PROMPT_TOKEN_WEIGHT + completion_tokens


def job_cost(job: GenerationJob) -> float:
    """The most the job can count: its prompt (estimated from its characters) and `max_tokens`."""
    if job.prompt is not None:
        chars = len(job.prompt)
    else:
        chars = sum(len(message.get("content") or "") for message in job.messages)
    return tokens_served(prompt_tokens=chars // CHARS_PER_TOKEN, completion_tokens=job.sampling.max_tokens)


_weights: tuple[float, dict[str, float]] | None = None


def kind_weights() -> dict[str, float]:
    """Each origin's weight as the console sets it (scheduler.models.SourceWeight; 1 when unset),
    read from the database at most once a second per process."""
    global _weights
    if _weights is not None and time.monotonic() - _weights[0] < WEIGHTS_CACHE_S:
        return _weights[1]
    weights = weights_stored()
    _weights = (time.monotonic(), weights)
    return weights


def weights_stored() -> dict[str, float]:
    """Each origin's weight as stored (1 when never set), in the origins' order."""
    stored = dict(SourceWeight.objects.values_list("origin", "weight"))
    return {str(origin): float(stored.get(str(origin), 1.0)) for origin in Origin}


def weights_forget() -> None:
    """A console edit applies to this process's next request at once."""
    global _weights
    _weights = None


def job_fair_share(
    job: GenerationJob, *, key_weight: float | None = None, guest_address: str | None = None
) -> FairShare:
    """The job's source (a guest's by `guest_address`), weight and charge: an API call's key may
    have its own weight (`key_weight`), every other job takes its origin's."""
    if key_weight is not None and job.origin == Origin.API:
        return FairShare.of(job, weight=key_weight)
    return FairShare.of(job, weight=kind_weights()[str(job.origin)], guest_address=guest_address)


# Lua shared by the claim and the settlement. Counters live in two sorted sets per tier: all
# remembered sources (`counters`) and the waiting ones (`active`), with the same scores.
LUA = """
-- The tier's floor: the least counter of its waiting sources, never lower than it was (a source
-- that joined with its idle credit does not lower the next one's start).
local function fair_floor(active_key, floor_key)
  local floor = tonumber(redis.call('GET', floor_key)) or 0
  local low = redis.call('ZRANGE', active_key, 0, 0, 'WITHSCORES')
  if #low > 0 and tonumber(low[2]) > floor then floor = tonumber(low[2]) end
  return floor
end
-- A source that starts waiting (or is served straight from the stream) starts at its own
-- counter, but no lower than the floor less the idle credit.
local function fair_start(counters_key, active_key, floor_key, source, credit)
  local own = tonumber(redis.call('ZSCORE', counters_key, source))
  local lowest = fair_floor(active_key, floor_key) - credit
  if own == nil or own < lowest then own = lowest end
  redis.call('ZADD', counters_key, own, source)
  return own
end
-- The waiting sources' counters are in `active` (never forgotten); the others' in `counters`.
local function fair_charge(counters_key, active_key, source, amount)
  local counter = tonumber(redis.call('ZSCORE', active_key, source))
                  or tonumber(redis.call('ZSCORE', counters_key, source))
  if counter == nil then return end  -- forgotten: at the floor less the credit at most
  counter = counter + tonumber(amount)
  redis.call('ZADD', counters_key, counter, source)
  redis.call('ZADD', active_key, 'XX', counter, source)
end
-- The last source to stop waiting leaves the floor at its counter (VTC's rule): a source served
-- with no competition raises the floor as it is served, so a newcomer starts level with it
-- less the idle credit, not with everything it was served alone.
local function fair_last_left(floor_key, counter)
  local floor = tonumber(redis.call('GET', floor_key)) or 0
  if tonumber(counter) > floor then redis.call('SET', floor_key, counter) end
end
local function fair_leave(counters_key, active_key, floor_key, source)
  local counter = redis.call('ZSCORE', active_key, source)
  if counter then
    redis.call('ZADD', counters_key, counter, source)
    redis.call('ZREM', active_key, source)
    if redis.call('ZCARD', active_key) == 0 then fair_last_left(floor_key, counter) end
  end
end
-- Remember the floor, and forget the counters below it less the credit (they would be lifted to
-- that): with the floor raised by the last to leave, that keeps the sources served recently.
-- Past `kept` counters (sources each served less than the credit, none raising the floor), the
-- least-served are forgotten too: each starts at the floor less the credit when it comes back,
-- ahead of its own counter by less than that credit. A waiting source's stays in `active`.
local function fair_tidy(counters_key, active_key, floor_key, credit, kept)
  local floor = fair_floor(active_key, floor_key)
  redis.call('SET', floor_key, floor)
  redis.call('ZREMRANGEBYSCORE', counters_key, '-inf', '(' .. (floor - credit))
  local extra = redis.call('ZCARD', counters_key) - kept
  if extra > 0 then redis.call('ZREMRANGEBYRANK', counters_key, 0, extra - 1) end
end
"""

_SETTLE = (
    LUA
    + """
-- KEYS: counters, active; ARGV: source, tokens (signed, already divided by the weight)
fair_charge(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
return 1
"""
)


async def fair_share_settle(
    client: aioredis.Redis,
    *,
    model: str,
    tier: str,
    share: FairShare,
    prompt_tokens: int,
    completion_tokens: int,
) -> None:
    """Correct the job's charge at claim (its most) by what it used. A source already forgotten
    (under the floor) stays forgotten: the correction could only lower it further."""
    used = tokens_served(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
    delta = share.charge(used) - share.charge(share.cost)
    if delta == 0:
        return
    await async_script(client, _SETTLE)(
        keys=[keys.fair_counters(model, tier), keys.fair_active(model, tier)], args=[share.source, delta]
    )


def idle_credit() -> float:
    return float(settings.FAIR_SHARE_IDLE_CREDIT_TOKENS)
