"""Celery beat that runs on every Celery host: each periodic task is still sent once a period.

Redis keeps, per task, when a beat last sent it (by Redis's clock, one for all hosts), and
that record is the schedule: a task is due when no beat has sent it for a period. The first
beat to find it due claims the period and sends it; the others learn when the period ends and
look again then, so every beat is at the task's next send, and when a host dies the next send
comes from another beat on time. There is no leader to elect and nothing to fail over.
"""

import logging

import redis
from celery.beat import PersistentScheduler, ScheduleEntry

from scheduler import keys
from scheduler.redis import sync_script

logger = logging.getLogger(__name__)

# Claimed if the last send is at least ARGV[1] seconds old: returns {1, the claim's stamp}.
# Otherwise {0, seconds until the last send is ARGV[2] (a period) old}. The mark outlives a
# period (ARGV[3]).
_CLAIM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local last = tonumber(redis.call('GET', KEYS[1]))
if last and now - last < tonumber(ARGV[1]) then
  return {0, tostring(last + tonumber(ARGV[2]) - now)}
end
redis.call('SET', KEYS[1], tostring(now), 'EX', ARGV[3])
return {1, tostring(now)}
"""

# A claim whose task could not be sent is taken back, unless another claim replaced it.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
"""

# Beats look again when the last send is a full period old, give or take the time their claim
# takes to reach Redis: a send counts as this period's unless it is this close to a full period
# old. Two sends are therefore never closer than the period minus this.
_TOLERANCE_S = 1.0
# How soon a beat that just sent a task looks at it again (and sends it again if the send
# failed), and how often it tries while Redis is unavailable.
_RETRY_S = 1.0


def _period_s(entry: ScheduleEntry) -> float:
    run_every = getattr(entry.schedule, "run_every", None)
    if run_every is None:
        raise TypeError(f"periodic task {entry.name} needs an interval schedule (seconds)")
    return run_every.total_seconds()


class OncePerPeriodScheduler(PersistentScheduler):
    def __init__(self, *args: object, **kwargs: object) -> None:
        self._claims: dict[str, str] = {}  # task -> the stamp of this beat's claim on its period
        super().__init__(*args, **kwargs)

    def is_due(self, entry: ScheduleEntry) -> tuple[bool, float]:
        """Due when no beat sent the task for a period, by Redis's record; the period is then
        claimed for this beat. Returns whether to send it now, and when to look again."""
        period_s = _period_s(entry)
        retry_s = min(_RETRY_S, period_s / 2)
        try:
            claimed, value = sync_script(_CLAIM)(
                keys=[keys.beat_sent(entry.name)],
                args=[period_s - min(_TOLERANCE_S, period_s / 10), period_s, int(period_s * 2) + 1],
            )
        except redis.RedisError as exc:
            # The broker is the same Redis: the task could not be sent now anyway.
            logger.warning("beat: %s not sent, Redis unavailable (%s)", entry.name, exc)
            return False, retry_s
        if not claimed:
            logger.info("beat: %s already sent this period", entry.name)
            return False, float(value)
        self._claims[entry.name] = value
        return True, retry_s

    def apply_async(
        self, entry: ScheduleEntry, producer: object = None, advance: bool = True, **kwargs: object
    ) -> object:
        try:
            return super().apply_async(entry, producer, advance, **kwargs)
        except Exception:
            # Not sent: the period is still to be served, by this beat when it looks again.
            try:
                sync_script(_RELEASE)(keys=[keys.beat_sent(entry.name)], args=[self._claims[entry.name]])
            except redis.RedisError:
                logger.warning("beat: %s not sent, and its claim stays until it expires", entry.name)
            raise
