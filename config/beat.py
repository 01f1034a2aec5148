"""Celery beat that runs on every Celery host: each periodic task is still sent once a period.

Each beat keeps its own schedule, and before sending a task asks Redis whether any beat sent
it less than a period ago (by Redis's clock, one for all hosts). The beat that finds the task
due first sends it; the others skip it. When a host dies, another beat's next turn comes
within a period, so there is no leader to elect and nothing to fail over.
"""

import logging

import redis
from celery.beat import PersistentScheduler, ScheduleEntry

from scheduler import keys
from scheduler.redis import sync_script

logger = logging.getLogger(__name__)

# Sent if the last send is at least ARGV[1] seconds old; the mark outlives a period (ARGV[2]).
_CLAIM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local last = tonumber(redis.call('GET', KEYS[1]))
if last and now - last < tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], tostring(now), 'EX', ARGV[2])
return 1
"""

# A beat's own next turn comes a full period after its last send, give or take the time its
# claim takes to reach Redis: a send counts as this period's unless it is this close to a full
# period old. Two beats' sends are therefore never closer than the period minus this.
_TOLERANCE_S = 1.0


class OncePerPeriodScheduler(PersistentScheduler):
    def apply_entry(self, entry: ScheduleEntry, producer: object = None) -> None:
        run_every = getattr(entry.schedule, "run_every", None)
        if run_every is None:
            raise TypeError(f"periodic task {entry.name} needs an interval schedule (seconds)")
        period_s = run_every.total_seconds()
        try:
            claimed = sync_script(_CLAIM)(
                keys=[keys.beat_sent(entry.name)],
                args=[period_s - min(_TOLERANCE_S, period_s / 10), int(period_s * 2) + 1],
            )
        except redis.RedisError as exc:
            # The broker is the same Redis: the task could not be sent now anyway.
            logger.warning("beat: %s not sent, Redis unavailable (%s)", entry.name, exc)
            return
        if not claimed:
            logger.info("beat: %s already sent this period by another beat", entry.name)
            return
        super().apply_entry(entry, producer=producer)
