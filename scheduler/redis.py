"""Redis clients: one sync client per process, one async client per event loop.

The clients retry with backoff on connection errors, so a Redis restart shows up as a short
delay (or a typed `RedisError` when it lasts), never as a crash loop. With Sentinels
configured, each new connection goes to the primary they name, so after a failover the retry
reaches the promoted replica.
"""

import asyncio
from functools import cache
from typing import Any

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as aiosentinel
import redis.connection
import redis.sentinel
from django.conf import settings
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

_RETRY_ERRORS = (redis.ConnectionError, redis.TimeoutError)


class NotReplicated(redis.ConnectionError):
    """A write reached the primary but not `REDIS_WAIT_REPLICAS` replicas in time. For the caller
    it is an unavailable Redis: a failover now would lose the write."""


def _client_options() -> dict:
    return {
        "decode_responses": True,
        "socket_connect_timeout": 2,
        "health_check_interval": 10,
        "retry_on_error": list(_RETRY_ERRORS),
    }


class _SentinelBlockingPool(redis.sentinel.SentinelConnectionPool, redis.BlockingConnectionPool):
    """Connections to the primary Sentinel names, waiting for a free one as the plain pool does."""


class _AsyncSentinelBlockingPool(aiosentinel.SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """The same for asyncio."""


def _sentinel_pool(pool_class: type, sentinel_class: type, options: dict) -> Any:
    """Connections to the primary the Sentinels name, logged in as REDIS_URL says."""
    sentinel = sentinel_class(settings.REDIS_SENTINELS, sentinel_kwargs=settings.REDIS_SENTINEL_KWARGS)
    return pool_class(
        settings.REDIS_SENTINEL_MASTER, sentinel, db=settings.REDIS_DB, **settings.REDIS_LOGIN, **options
    )


@cache
def sync_redis() -> redis.Redis:
    # Under ASGI each request's sync code runs in a thread of its own, so a burst of requests
    # asks for many connections at once: they wait for one (bounded) instead of failing.
    options = {
        "max_connections": settings.REDIS_MAX_CONNECTIONS,
        "timeout": 10,
        "socket_timeout": 5,
        **_client_options(),
    }
    if settings.REDIS_SENTINELS:
        pool: redis.ConnectionPool = _sentinel_pool(_SentinelBlockingPool, redis.sentinel.Sentinel, options)
    else:
        pool = redis.BlockingConnectionPool.from_url(settings.REDIS_URL, **options)
    return redis.Redis(connection_pool=pool, retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=2))


_async_clients: dict[asyncio.AbstractEventLoop, aioredis.Redis] = {}

_HIREDIS = redis.connection.HiredisRespSerializer()


class _PackedInC:
    """Commands packed by hiredis, as redis-py's sync connections pack them. Its asyncio ones
    pack in Python, one argument at a time: a worker's batch of 5000 streamed tokens (15,000
    arguments) took 17 ms to pack, against 4 ms here."""

    def pack_command(self, *args: Any) -> list[bytes]:
        return _HIREDIS.pack(*args)


@cache
def _packed_in_c(connection_class: type) -> type:
    return type(connection_class.__name__, (_PackedInC, connection_class), {})


def async_redis() -> aioredis.Redis:
    """The shared async client of the running event loop (daphne has one, the worker has one)."""
    loop = asyncio.get_running_loop()
    client = _async_clients.get(loop)
    if client is None:
        client = new_async_redis()
        _async_clients[loop] = client
    return client


def new_async_redis(*, single_connection: bool = False, socket_timeout: float = 5.0) -> aioredis.Redis:
    """A private async client, e.g. for a blocking read that must not hold a pooled connection
    (give it a `socket_timeout` longer than its reads block)."""
    from redis.asyncio.retry import Retry as AsyncRetry

    options = {
        "max_connections": settings.REDIS_MAX_CONNECTIONS,
        "timeout": 10,
        "socket_timeout": socket_timeout,
        **_client_options(),
    }
    if settings.REDIS_SENTINELS:
        pool: aioredis.ConnectionPool = _sentinel_pool(
            _AsyncSentinelBlockingPool, aiosentinel.Sentinel, options
        )
    else:
        pool = aioredis.BlockingConnectionPool.from_url(settings.REDIS_URL, **options)
    # Whatever the pool connects with (TCP, TLS, a socket, the Sentinels' primary).
    pool.connection_class = _packed_in_c(pool.connection_class)
    return aioredis.Redis(
        connection_pool=pool,
        retry=AsyncRetry(ExponentialBackoff(cap=0.5, base=0.05), retries=2),
        single_connection_client=single_connection,
    )


def script_replicated(source: str, *, keys: list[str], args: list[object]) -> tuple[Any, bool]:
    """Run a script, then (with REDIS_WAIT_REPLICAS) wait until that many replicas have its
    writes, on the same connection as WAIT requires: one round trip either way. Returns its
    reply and whether the replicas confirmed it."""
    script = sync_script(source)
    if not settings.REDIS_WAIT_REPLICAS:
        return script(keys=keys, args=args), True
    try:
        return _evalsha_and_wait(script.sha, keys, args)
    except redis.exceptions.NoScriptError:
        sync_redis().script_load(source)  # a restarted Redis has forgotten it
        return _evalsha_and_wait(script.sha, keys, args)


def _evalsha_and_wait(sha: str, keys: list[str], args: list[object]) -> tuple[Any, bool]:
    # EVALSHA itself, not the script object: a pipeline asks SCRIPT EXISTS for the scripts
    # called through it, a round trip more on every call.
    pipe = sync_redis().pipeline(transaction=False)
    pipe.evalsha(sha, len(keys), *keys, *args)
    pipe.wait(settings.REDIS_WAIT_REPLICAS, round(settings.REDIS_WAIT_TIMEOUT_S * 1000))
    reply, acknowledged = pipe.execute()
    return reply, acknowledged >= settings.REDIS_WAIT_REPLICAS


def sync_script(source: str) -> redis.commands.core.Script:
    return _registered_script(sync_redis(), source)


@cache
def _registered_script(client: redis.Redis, source: str) -> redis.commands.core.Script:
    return client.register_script(source)


def async_script(client: aioredis.Redis, source: str) -> redis.commands.core.AsyncScript:
    return client.register_script(source)
