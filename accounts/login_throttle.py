"""Sign-in throttling: attempts are counted in Redis per username and per address.

A username with too many failures in the window is refused for the rest of the window whoever
tries it (password guessing spread over many addresses), and an address with too many is
refused whatever username it tries (one address guessing through many accounts).

Every attempt is counted before its password is checked, in one transaction, and the right
password takes its count back: parallel attempts each see the count with all the others in it,
so a window never lets more than its allowance of guesses reach the password check.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import redis
from django.conf import settings

from scheduler import keys
from scheduler.rate_limits import address_scope
from scheduler.redis import sync_redis, sync_script

logger = logging.getLogger(__name__)

# The username's count ends; the address's loses this attempt, if its window is still open (a
# DECR of an expired counter would make one that never expires).
_SUCCEEDED = """
redis.call('DEL', KEYS[1])
local attempts = tonumber(redis.call('GET', KEYS[2]) or '0')
if attempts > 0 then redis.call('DECR', KEYS[2]) end
"""


@dataclass(frozen=True, slots=True)
class LoginAttempt:
    username: str
    address: str

    def _username_key(self) -> str:
        # Usernames are hashed to bound the key; casefolded so that case does not buy guesses.
        digest = hashlib.sha256(self.username.casefold().encode()).hexdigest()[:32]
        return keys.login_failures_username(digest)

    def _address_key(self) -> str:
        return keys.login_failures_address(address_scope(self.address))

    def scopes(self) -> list[tuple[str, int]]:
        """(counter key, failures allowed) per scope."""
        return [
            (self._username_key(), settings.LOGIN_MAX_FAILURES_PER_USERNAME),
            (self._address_key(), settings.LOGIN_MAX_FAILURES_PER_ADDRESS),
        ]


def login_attempt_begin(attempt: LoginAttempt) -> int:
    """Count the attempt as a failure until `login_succeeded` says otherwise. Returns the seconds
    until this username may be tried from this address again (the attempt is refused), or 0 (its
    password may be checked).

    Without Redis sign-in still works, unthrottled: locking every customer out would be worse.
    """
    scopes = attempt.scopes()
    try:
        with sync_redis().pipeline(transaction=True) as pipe:
            for key, _ in scopes:
                pipe.set(key, 0, ex=settings.LOGIN_FAILURE_WINDOW_S, nx=True)  # the window's start
                pipe.incr(key)
                pipe.ttl(key)
            replies = pipe.execute()
    except redis.RedisError:
        logger.warning("Sign-in throttling is off while Redis is unreachable", exc_info=True)
        return 0
    waits = [
        max(1, ttl)
        for (_, allowed), attempts, ttl in zip(scopes, replies[1::3], replies[2::3], strict=True)
        if int(attempts) > allowed
    ]
    return max(waits, default=0)


def login_succeeded(attempt: LoginAttempt) -> None:
    """The right password ends the username's count, and takes this attempt off the address's
    (not the rest of it: a guesser's own account must not reset what it spends on others)."""
    try:
        sync_script(_SUCCEEDED)(keys=[key for key, _ in attempt.scopes()])
    except redis.RedisError:
        logger.warning("Could not reset a sign-in count while Redis is unreachable", exc_info=True)
