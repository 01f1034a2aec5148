import tempfile
from pathlib import Path

import pytest

from tests.e2e.stack import Stack

# Generous limits: these tests are about the path of a message, not about refusals.
SPINE_SETTINGS = {
    "INFERENCE_ENGINE": "simulated",
    "INFERENCE_MAX_NUM_SEQS": "8",
    "VIP_RESERVED_SLOTS": "2",
    "SIMULATED_OUTPUT_TOKENS": "30",
    "SIMULATED_DECODE_BASE_S": "0.01",
    "RATE_LIMIT_NORMAL_CAPACITY": "100",
    "RATE_LIMIT_VIP_CAPACITY": "100",
    "MAX_CONCURRENT_NORMAL": "50",
    "MAX_CONCURRENT_VIP": "50",
    "JOB_LEASE_S": "3",
    "WORKER_HEARTBEAT_S": "0.5",
    "WORKER_HEARTBEAT_TTL_S": "3",
    # These tests follow a message through the engine; test_answer_cache.py turns the cache on.
    "ANSWER_CACHE_ENABLED": "false",
}


def running_stack(**settings_env: str):
    stack = Stack(Path(tempfile.mkdtemp(prefix="e2e-")), **{**SPINE_SETTINGS, **settings_env})
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def stack():
    yield from running_stack()
