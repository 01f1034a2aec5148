import logging

import pytest

from knowledge.index import current_index
from scheduler import policy, routing
from scheduler.redis import sync_redis

logging.getLogger("httpx").setLevel(logging.WARNING)


@pytest.fixture(autouse=True)
def _empty_redis():
    """Each test starts with an empty private Redis (never the machine's shared one)."""
    sync_redis().flushdb()
    policy._cache.clear()
    routing._cache.clear()
    # The database is rolled back between tests, and its knowledge-base version with it.
    current_index.forget()
    yield
