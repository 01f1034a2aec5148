"""Stopping with Redis down: each process told to stop (SIGTERM) exits promptly, and what a
worker could not hand back is finished by another worker once Redis returns."""

import asyncio
import contextlib
import json
import os
import signal
import time

import pytest
import redis

from launcher.process import Process
from scheduler import keys
from tests.e2e.client import ChatClient
from tests.e2e.conftest import running_stack
from tests.generation_jobs import MODEL

pytestmark = pytest.mark.e2e

DRAIN_TIMEOUT_S = 2
# SIGTERM to exit: the drain timeout, the worker's hand-back (5 s), and room for a loaded machine.
EXIT_DEADLINE_S = DRAIN_TIMEOUT_S + 5 + 20


@pytest.fixture(scope="module")
def stack():
    yield from running_stack(
        SIMULATED_DECODE_BASE_S="0.05",
        SIMULATED_OUTPUT_TOKENS="200",  # answers take about 10 s
        WORKER_DRAIN_TIMEOUT_S=str(DRAIN_TIMEOUT_S),
        JOB_LEASE_S="2",
    )


def _redis(stack) -> redis.Redis:
    return redis.Redis.from_url(stack.redis.url, decode_responses=True)


async def _until_running(stack, count: int) -> None:
    with _redis(stack) as client:
        while True:
            running = [
                json.loads(client.get(key) or "{}").get("running") for key in client.scan_iter("llm:worker:*")
            ]
            if count in running:
                return
            await asyncio.sleep(0.05)


def _known_workers(stack) -> set[str]:
    """Workers Redis still knows of: capacity reports and consumers of the queues."""
    with _redis(stack) as client:
        known = set(client.hkeys(keys.capacity(MODEL)))
        for tier in keys.TIERS:
            if client.exists(keys.queue(MODEL, tier)):
                known |= {
                    c["name"] for c in client.xinfo_consumers(keys.queue(MODEL, tier), keys.CONSUMER_GROUP)
                }
        return known


async def _until_forgotten(stack, worker_id: str) -> None:
    while True:
        if worker_id not in _known_workers(stack):
            return
        await asyncio.sleep(0.1)


def _group_exits(pgid: int) -> bool:
    """Wait for every process of a group (Celery and its beat) to be gone."""
    deadline = time.monotonic() + EXIT_DEADLINE_S
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _exits(process: Process) -> int | None:
    """The leader's exit status once it ends by itself, or None. Reaped without touching its
    process group, so that what it leaves behind can still be seen."""
    deadline = time.monotonic() + EXIT_DEADLINE_S
    while process.running():
        if time.monotonic() > deadline:
            return None
        time.sleep(0.1)
    return process.popen.wait()


def test_a_worker_stopped_while_redis_is_down_exits_and_its_job_is_finished_by_another(stack):
    async def scenario():
        async with ChatClient(stack.base_url) as guest:
            conversation = await guest.open_page()
            request_id = await guest.ask(conversation, "Stop while Redis is down")
            stream = asyncio.create_task(guest.stream(request_id))
            await asyncio.wait_for(_until_running(stack, 1), 60)
            [worker] = stack.workers
            [worker_id] = _known_workers(stack)
            await asyncio.to_thread(stack.redis.stop)
            worker.send_signal(signal.SIGTERM)
            returncode = await asyncio.to_thread(_exits, worker)
            if returncode is None:
                worker.kill()
            stack.workers.remove(worker)
            await asyncio.to_thread(stack.redis.start)
            await asyncio.to_thread(stack.start_worker)
            result = await asyncio.wait_for(stream, 120)
            # The dead worker holds nothing any more: it is forgotten.
            await asyncio.wait_for(_until_forgotten(stack, worker_id), 60)
            return request_id, returncode, result

    request_id, returncode, result = asyncio.run(scenario())
    assert returncode is not None, "the worker did not exit after SIGTERM while Redis was down"
    assert result.terminal.event == "done"
    assert result.of("reset"), "the stream was not told that the answer restarted"
    assert result.text.startswith("[simulated]")
    assert stack.count_assistant_messages(request_id) == [("done", result.text)]


@contextlib.contextmanager
def _redis_paused(stack):
    """Redis stops answering without closing anything, as an overloaded or cut-off one does."""
    stack.redis.process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        stack.redis.process.send_signal(signal.SIGCONT)


@contextlib.contextmanager
def _redis_down(stack):
    stack.redis.stop()
    try:
        yield
    finally:
        stack.redis.start()


def _until_another_worker_reports(stack, known: set[str]) -> None:
    deadline = time.monotonic() + 120
    with _redis(stack) as client:
        while not set(client.hkeys(keys.capacity(MODEL))) - known:
            assert time.monotonic() < deadline, "the new worker never reported"
            time.sleep(0.05)


def test_a_worker_stopped_while_redis_does_not_answer_exits(stack):
    known = _known_workers(stack)
    worker = stack.start_worker()
    stack.workers.remove(worker)
    _until_another_worker_reports(stack, known)  # serving, with its SIGTERM handler in place
    with _redis_paused(stack):
        worker.send_signal(signal.SIGTERM)
        returncode = _exits(worker)
    if returncode is None:
        worker.kill()
    assert returncode is not None, "the worker did not exit after SIGTERM while Redis did not answer"


@pytest.mark.parametrize("redis_state", [_redis_down, _redis_paused], ids=["down", "not-answering"])
def test_celery_with_beat_stopped_while_redis_is_unavailable_exits(stack, redis_state):
    celery = stack.start_celery(beat=True)
    with redis_state(stack):
        celery.send_signal(signal.SIGTERM)
        returncode = _exits(celery)
        group_gone = _group_exits(celery.pid)
    stack.celery_workers.remove(celery)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(celery.pid, signal.SIGKILL)
    assert returncode is not None, "Celery did not exit after SIGTERM while Redis was unavailable"
    assert group_gone, "Celery exited but left processes of its group (beat) behind"


def test_web_stopped_while_redis_is_down_exits_with_streams_open(stack):
    async def scenario():
        async with ChatClient(stack.base_url) as guest:
            conversation = await guest.open_page()
            request_id = await guest.ask(conversation, "Stop the web while Redis is down")
            stream = asyncio.create_task(guest.stream(request_id))
            await asyncio.wait_for(_until_running(stack, 1), 60)
            with _redis_down(stack):
                stack.web.send_signal(signal.SIGTERM)
                returncode = await asyncio.to_thread(_exits, stack.web)
            stream.cancel()
            return returncode

    returncode = asyncio.run(scenario())
    assert returncode is not None, "the web process did not exit after SIGTERM while Redis was down"
