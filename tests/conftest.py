import importlib
import logging

import pytest

from knowledge.index import current_index
from scheduler import policy, routing, warmpool
from scheduler.redis import sync_redis

logging.getLogger("httpx").setLevel(logging.WARNING)

# What a new database starts with: the fixtures below write it again after a transactional test.
_STARTING_ROWS = "scheduler.migrations.0002_tier_policies_and_variants"


@pytest.fixture(autouse=True)
def _empty_redis():
    """Each test starts with an empty private Redis (never the machine's shared one)."""
    sync_redis().flushdb()
    policy._cache.clear()
    routing._cache.clear()
    routing._experiment_cache.clear()
    routing._variants.clear()
    warmpool._cache.clear()
    # The database is rolled back between tests, and its knowledge-base version with it.
    current_index.forget()
    yield


@pytest.fixture
def tier_policies() -> None:
    """The tier policies the migrations write: a transactional test empties every table after it,
    and the next one finds none unless they are written again."""
    from django.apps import apps

    from scheduler.policy import policies_mirror

    importlib.import_module(_STARTING_ROWS).tier_policies_create(apps, None)
    policies_mirror()


@pytest.fixture
def variants(db) -> None:
    """The variants the migrations write (`stable` and `candidate`): a transactional test empties
    every table after it, and the next one finds none unless they are written again."""
    from django.apps import apps

    importlib.import_module(_STARTING_ROWS).variants_create(apps, None)
