import tempfile
from pathlib import Path

import pytest

from tests.multihost.topology import MultiHost

# Long answers, so that a host dies mid-answer; limits that never refuse this test's traffic.
MULTIHOST_SETTINGS = {
    "INFERENCE_ENGINE": "simulated",
    "INFERENCE_MAX_NUM_SEQS": "6",
    "VIP_RESERVED_SLOTS": "0",
    "SIMULATED_OUTPUT_TOKENS": "120",
    "SIMULATED_DECODE_BASE_S": "0.04",
    "RATE_LIMIT_NORMAL_CAPACITY": "1000",
    "MAX_CONCURRENT_NORMAL": "1000",
    "GUEST_ADDRESS_BUCKET_FACTOR": "100",
    "WAIT_SLO_NORMAL_S": "600",
    "MAX_WAIT_NORMAL_S": "600",
    "SERVICE_TIME_PRIOR_S": "5",
    "JOB_LEASE_S": "3",
    "WORKER_HEARTBEAT_S": "0.5",
    "WORKER_HEARTBEAT_TTL_S": "3",
    "CANARY_EVALUATION_S": "2",
    "STREAM_DISCONNECT_GRACE_S": "60",
    # nginx ends a stream silent for three heartbeats (launcher/nginx.py): a web host that
    # vanishes costs its streams about 3 s, not the deployed 45.
    "SSE_HEARTBEAT_S": "1",
    "ANSWER_CACHE_ENABLED": "false",  # every answer goes through the hosts' engines
}


# What the scenarios measured, printed at the end of every run (docs/DEPLOY.md keeps a record).
_MEASURED = pytest.StashKey[list[str]]()


@pytest.fixture(scope="session")
def measured(pytestconfig: pytest.Config) -> list[str]:
    """Lines of figures a scenario measured, for the run's summary."""
    return pytestconfig.stash.setdefault(_MEASURED, [])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    lines = config.stash.get(_MEASURED, [])
    if lines:
        terminalreporter.section("multi-host test: measured")
        for line in lines:
            terminalreporter.line(line)


@pytest.fixture(scope="session")
def hosts():
    workdir = Path(tempfile.mkdtemp(prefix="multihost-"))
    workdir.chmod(0o755)  # PostgreSQL runs as its own account under it
    topology = MultiHost(workdir, **MULTIHOST_SETTINGS)
    topology.start()
    try:
        yield topology
    finally:
        topology.stop()
