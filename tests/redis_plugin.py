"""Pytest plugin: start a private redis-server before Django reads its settings.

Loaded with `-p tests.redis_plugin` (see pyproject.toml) and run as a hook wrapper so that
REDIS_URL is set before pytest-django sets Django up.
"""

import os
import signal
import tempfile
from pathlib import Path

import pytest

from launcher.process import interrupt_on
from launcher.redis import RedisServer

_server: RedisServer | None = None


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config, parser, args):
    global _server
    # `kill` (SIGTERM) stops the run as Ctrl-C does: fixtures stop their stacks, and
    # pytest_unconfigure this server, instead of leaving them running without their owner.
    interrupt_on(signal.SIGTERM)
    try:
        _server = RedisServer(Path(tempfile.mkdtemp(prefix="test-redis-")))
    except RuntimeError as exc:  # no redis-server: every test needs it, one line says so
        raise pytest.UsageError(str(exc)) from None
    _server.start()
    os.environ["REDIS_URL"] = _server.url
    os.environ.setdefault("INFERENCE_ENGINE", "simulated")
    # The model the test workers serve (and the migration gives the variants it makes).
    os.environ.setdefault("INFERENCE_MODEL_NAME", "test-model")
    # The stable variant's answers are a model's, so that the tests of the queues, the worker and
    # the streams have answers to queue; the answer-style tests set each style themselves.
    os.environ.setdefault("CHAT_ANSWER_STYLE", "generated")
    # Settings refuse to start without a secret key; the processes tests start inherit this one.
    os.environ.setdefault("DJANGO_SECRET_KEY", "tests-only-secret-key-never-used-outside-the-test-suite")
    return (yield)


def pytest_unconfigure(config):
    if _server is not None:
        _server.stop()


@pytest.fixture(scope="session")
def redis_server() -> RedisServer:
    assert _server is not None
    return _server
