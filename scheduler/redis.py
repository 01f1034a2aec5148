"""Redis clients: one sync client per process, one async client per event loop.

The clients retry with backoff on connection errors, so a Redis restart shows up as a short
delay (or a typed `RedisError` when it lasts), never as a crash loop.
"""

import asyncio
from functools import cache

import redis
import redis.asyncio as aioredis
from django.conf import settings
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

_RETRY_ERRORS = (redis.ConnectionError, redis.TimeoutError)


def _client_options() -> dict:
    return {
        "decode_responses": True,
        "socket_connect_timeout": 2,
        "health_check_interval": 10,
        "retry_on_error": list(_RETRY_ERRORS),
    }


@cache
def sync_redis() -> redis.Redis:
    # Under ASGI each request's sync code runs in a thread of its own, so a burst of requests
    # asks for many connections at once: they wait for one (bounded) instead of failing.
    pool = redis.BlockingConnectionPool.from_url(
        settings.REDIS_URL,
        max_connections=settings.REDIS_MAX_CONNECTIONS,
        timeout=10,
        socket_timeout=5,
        **_client_options(),
    )
    return redis.Redis(connection_pool=pool, retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=2))


_async_clients: dict[asyncio.AbstractEventLoop, aioredis.Redis] = {}


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

    pool = aioredis.BlockingConnectionPool.from_url(
        settings.REDIS_URL,
        max_connections=settings.REDIS_MAX_CONNECTIONS,
        timeout=10,
        socket_timeout=socket_timeout,
        **_client_options(),
    )
    return aioredis.Redis(
        connection_pool=pool,
        retry=AsyncRetry(ExponentialBackoff(cap=0.5, base=0.05), retries=2),
        single_connection_client=single_connection,
    )


def sync_script(source: str) -> redis.commands.core.Script:
    return _registered_script(sync_redis(), source)


@cache
def _registered_script(client: redis.Redis, source: str) -> redis.commands.core.Script:
    return client.register_script(source)


def async_script(client: aioredis.Redis, source: str) -> redis.commands.core.AsyncScript:
    return client.register_script(source)
