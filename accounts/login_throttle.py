"""Sign-in throttling: failed attempts are counted in Redis per username and per address.

A username with too many failures in the window is refused for the rest of the window whoever
tries it (password guessing spread over many addresses), and an address with too many is
refused whatever username it tries (one address guessing through many accounts).
"""

from __future__ import annotations

import hashlib
import logging

import redis
from django.conf import settings

from scheduler import keys
from scheduler.rate_limits import address_scope
from scheduler.redis import sync_redis

logger = logging.getLogger(__name__)


def _keys(*, username: str, address: str) -> list[tuple[str, int]]:
    """(counter key, failures allowed) per scope; usernames are hashed to bound the key."""
    digest = hashlib.sha256(username.casefold().encode()).hexdigest()[:32]
    return [
        (keys.login_failures_username(digest), settings.LOGIN_MAX_FAILURES_PER_USERNAME),
        (keys.login_failures_address(address_scope(address)), settings.LOGIN_MAX_FAILURES_PER_ADDRESS),
    ]


def login_retry_after_s(*, username: str, address: str) -> int:
    """Seconds until this username may be tried from this address again; 0: now.

    Without Redis sign-in still works, unthrottled: locking every customer out would be worse.
    """
    scopes = _keys(username=username, address=address)
    try:
        with sync_redis().pipeline(transaction=False) as pipe:
            for key, _ in scopes:
                pipe.get(key)
                pipe.ttl(key)
            replies = pipe.execute()
    except redis.RedisError:
        logger.warning("Sign-in throttling is off while Redis is unreachable", exc_info=True)
        return 0
    waits = [
        max(1, ttl)
        for (_, allowed), failures, ttl in zip(scopes, replies[::2], replies[1::2], strict=True)
        if failures is not None and int(failures) >= allowed
    ]
    return max(waits, default=0)


def login_failed(*, username: str, address: str) -> None:
    window_s = settings.LOGIN_FAILURE_WINDOW_S
    try:
        with sync_redis().pipeline(transaction=False) as pipe:
            for key, _ in _keys(username=username, address=address):
                pipe.set(key, 0, ex=window_s, nx=True)  # the window starts at the first failure
                pipe.incr(key)
            pipe.execute()
    except redis.RedisError:
        logger.warning("Could not count a failed sign-in while Redis is unreachable", exc_info=True)


def login_succeeded(*, username: str, address: str) -> None:
    """The right password ends the username's count (not the address's: a guesser's own
    account must not reset what it spends on others)."""
    username_key, _ = _keys(username=username, address=address)[0]
    try:
        sync_redis().delete(username_key)
    except redis.RedisError:
        logger.warning("Could not reset a sign-in count while Redis is unreachable", exc_info=True)
