"""Which agents are online: every open inbox tab beats (admin_console's inbox socket), and an
agent is online while one of their tabs has beaten within HANDOFF_PRESENCE_TTL_S. A tab that
closes leaves at once; one whose process died stops beating and ages out."""

from __future__ import annotations

import time

import redis
from django.conf import settings

from scheduler import keys
from scheduler.redis import sync_redis


def presence_beat(*, agent_id: int, tab_id: str) -> None:
    now = time.time()
    with sync_redis().pipeline(transaction=False) as pipe:
        pipe.zadd(keys.AGENTS_PRESENCE, {f"{agent_id}:{tab_id}": now})
        pipe.zremrangebyscore(keys.AGENTS_PRESENCE, "-inf", now - settings.HANDOFF_PRESENCE_TTL_S)
        pipe.execute()


def presence_leave(*, agent_id: int, tab_id: str) -> None:
    sync_redis().zrem(keys.AGENTS_PRESENCE, f"{agent_id}:{tab_id}")


def agents_online() -> set[int]:
    """The ids of the agents with a live inbox tab; none while Redis cannot say (the customer is
    then offered to leave a question, which is never wrong)."""
    since = time.time() - settings.HANDOFF_PRESENCE_TTL_S
    try:
        members = sync_redis().zrangebyscore(keys.AGENTS_PRESENCE, since, "+inf")
    except (redis.ConnectionError, redis.TimeoutError):
        return set()
    return {int(member.partition(":")[0]) for member in members}
