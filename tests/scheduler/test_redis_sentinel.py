"""With Sentinels, every Redis client of the product (ours, the channel layer, Celery's broker)
logs in to the Sentinels with their password and to the primary with REDIS_URL's account."""

from __future__ import annotations

import subprocess
import sys

import pytest
import redis

from launcher.process import ROOT, free_port
from launcher.redis import RedisLogin, RedisSentinel, RedisServer
from launcher.stack import inherited_env

MASTER = "auth-check"
ACCOUNT = RedisLogin(username="chat", password="s3cret/with:odd@chars")
SENTINEL_PASSWORD = "sentinel-s3cret"

# Run in a process of its own: the settings read the environment once, at start.
CLIENTS = """
import asyncio
import django

django.setup()
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from config.celery import app
from scheduler.redis import new_async_redis, sync_redis

sync_redis().set("auth-check:sync", "1")


async def async_client():
    client = new_async_redis()
    await client.set("auth-check:async", "1")
    await client.aclose()


asyncio.run(async_client())
layer = get_channel_layer()
async_to_sync(layer.send)("auth-check", {"type": "hello"})
assert async_to_sync(layer.receive)("auth-check") == {"type": "hello"}
app.send_task("auth-check", queue="auth-check")
"""


@pytest.fixture
def protected(tmp_path):
    """A primary that only the account may use, behind a Sentinel that wants its password."""
    primary = RedisServer(tmp_path / "redis", login=ACCOUNT)
    sentinel = RedisSentinel(
        tmp_path / "sentinel",
        master_name=MASTER,
        primary=(primary.host, primary.port),
        quorum=1,
        login=ACCOUNT,
        password=SENTINEL_PASSWORD,
        port=free_port(),
    )
    try:
        primary.start()
        sentinel.start()
        yield primary, sentinel
    finally:
        sentinel.stop()
        primary.stop()


def test_every_client_logs_in_to_the_sentinels_and_the_primary(protected):
    primary, sentinel = protected
    env = inherited_env(
        REDIS_URL=primary.url.replace("/0", "/3"),
        REDIS_SENTINELS=sentinel.address,
        REDIS_SENTINEL_MASTER=MASTER,
        REDIS_SENTINEL_PASSWORD=SENTINEL_PASSWORD,
        DJANGO_SETTINGS_MODULE="config.settings",
    )
    done = subprocess.run(
        [sys.executable, "-c", CLIENTS], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    data = redis.Redis(
        host=primary.host, port=primary.port, db=3, username=ACCOUNT.username, password=ACCOUNT.password
    )
    assert data.exists("auth-check:sync", "auth-check:async") == 2
    assert data.llen("auth-check") == 1, "Celery's message is in its queue"
