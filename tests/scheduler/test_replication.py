"""An accepted job has reached the replicas (REDIS_WAIT_REPLICAS): a failover loses none."""

import time
from pathlib import Path

import pytest
import redis

from launcher.redis import RedisServer
from scheduler import keys
from scheduler.queues import job_enqueue
from scheduler.redis import NotReplicated, sync_redis
from tests.generation_jobs import MODEL, generation_job


def _enqueue(request_id: str):
    return job_enqueue(
        tier="normal",
        job=generation_job(request_id, messages=[{"role": "user", "content": request_id}]),
        max_queued=100,
        wait_slo_s=1000,
        max_wait_s=60,
    )


@pytest.fixture
def replica(redis_server, tmp_path: Path):
    server = RedisServer(tmp_path / "replica", replica_of=("127.0.0.1", redis_server.port))
    server.start()
    client = redis.Redis(port=server.port, decode_responses=True)
    deadline = time.monotonic() + 30
    # Synced, and done writing its first AOF (until then it refuses to stop).
    while not (
        client.info("replication")["master_link_status"] == "up"
        and client.info("persistence")["aof_rewrite_in_progress"] == 0
        and client.info("persistence")["aof_rewrite_scheduled"] == 0
    ):
        assert time.monotonic() < deadline, "the replica did not sync with the primary"
        time.sleep(0.05)
    yield client
    client.close()
    server.stop()


def test_a_job_the_replicas_did_not_confirm_is_refused_and_never_served(settings):
    settings.REDIS_WAIT_REPLICAS = 1
    settings.REDIS_WAIT_TIMEOUT_S = 0.05
    with pytest.raises(NotReplicated):
        _enqueue("r1")
    # The job stays in the primary's queue (positions count it), marked so a worker skips it.
    assert sync_redis().get(keys.cancel("r1"))


def test_an_accepted_job_is_on_the_replica_when_it_is_accepted(settings, replica):
    settings.REDIS_WAIT_REPLICAS = 1
    assert _enqueue("r1").admitted
    # Read at once, without waiting: WAIT already made sure it is there.
    entries = replica.xrange(keys.queue(MODEL, "normal"))
    assert [fields["request_id"] for _, fields in entries] == ["r1"]
