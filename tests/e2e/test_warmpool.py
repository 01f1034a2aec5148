"""The warm pool: with one spare wanted, of two workers one serves and one waits with its engine
loaded; when load raises the desired count, the spare starts answering within a few seconds.

Real processes: redis, daphne and two simulated inference workers. Each answer takes about
2 s on a worker of two slots, so a burst of questions asks for more than one worker.
"""

import asyncio
import json
import time

import pytest
import redis

from scheduler import keys
from tests.e2e.client import ChatClient
from tests.e2e.conftest import running_stack

pytestmark = pytest.mark.e2e

QUESTIONS = 8


@pytest.fixture(scope="module")
def stack():
    for stack in running_stack(
        INFERENCE_MAX_NUM_SEQS="2",
        VIP_RESERVED_SLOTS="0",
        SIMULATED_DECODE_BASE_S="0.05",
        SIMULATED_OUTPUT_TOKENS="40",
        SERVICE_TIME_PRIOR_S="2",
        AUTOSCALE_TARGET_UTILIZATION="1",
        AUTOSCALE_ARRIVAL_WINDOW_S="5",
    ):
        done = stack.manage(
            "shell",
            "-c",
            "from scheduler.models import WarmPool; from scheduler.warmpool import spares_mirror; "
            "WarmPool.objects.update_or_create(pk=1, defaults={'spares': 1}); spares_mirror()",
        )
        assert done.returncode == 0, done.stderr
        stack.start_worker()
        yield stack


def _heartbeats(client: redis.Redis) -> dict[str, dict]:
    worker_ids = client.zrange(keys.WORKERS_INDEX, 0, -1)
    beats = [json.loads(raw) for raw in client.mget([keys.worker_heartbeat(w) for w in worker_ids]) if raw]
    return {beat["worker_id"]: beat for beat in beats}


def _wait_for(condition, what: str, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_spare_waits_until_load_needs_it_then_answers(stack):
    client = redis.Redis.from_url(stack.redis.url, decode_responses=True)

    def one_spare_one_serving() -> str | None:
        beats = _heartbeats(client)
        spares = [w for w, beat in beats.items() if beat["spare"]]
        return spares[0] if len(beats) == 2 and len(spares) == 1 else None

    spare = _wait_for(one_spare_one_serving, "one spare and one serving worker")

    def spare_answering() -> bool:
        beat = _heartbeats(client).get(spare)
        return beat is not None and not beat["spare"] and beat["running"] > 0

    async def burst():
        async with ChatClient(stack.base_url) as alice:
            await alice.login("alice", "alice-demo-pass")
            asked = [
                await alice.ask(await alice.new_conversation(), f"question {n}") for n in range(QUESTIONS)
            ]
            # The former spare answers some of the burst while the rest still wait.
            await asyncio.to_thread(_wait_for, spare_answering, "the spare to answer", 10.0)
            return await asyncio.gather(*(alice.stream(request_id) for request_id in asked))

    results = asyncio.run(burst())
    assert all(result.terminal.event == "done" for result in results)
