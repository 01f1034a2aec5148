"""A worker running real vLLM, killed with SIGKILL mid-answer (as the OOM killer does), leaves
no engine process behind; a new worker starts, serves, and the answer completes."""

import asyncio
import os
import signal
import time

import psutil
import pytest

from tests.e2e.client import ChatClient
from tests.e2e.conftest import LONG_ANSWER_MAX_TOKENS, LONG_ANSWER_QUESTION, running_stack

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


@pytest.fixture(scope="module")
def stack():
    yield from running_stack(
        INFERENCE_ENGINE="vllm",
        INFERENCE_MAX_NUM_SEQS="4",
        VIP_RESERVED_SLOTS="0",
        GENERATION_MAX_TOKENS=LONG_ANSWER_MAX_TOKENS,
        GENERATION_TEMPERATURE="0",
    )


def test_a_worker_killed_mid_answer_leaves_no_engine_and_a_new_worker_finishes_the_answer(stack):
    async def scenario():
        async with ChatClient(stack.base_url, timeout_s=300) as guest:
            conversation = await guest.open_page()
            request_id = await guest.ask(conversation, LONG_ANSWER_QUESTION)
            first = await guest.stream(request_id, stop_after_tokens=2)
            [worker] = stack.workers
            engine = psutil.Process(worker.pid).children(recursive=True)
            # As the OOM killer does: the worker's process alone, not its process group (which the
            # launcher's own kill would take down, engine included).
            os.kill(worker.pid, signal.SIGKILL)
            killed = time.monotonic()
            _, left = await asyncio.to_thread(psutil.wait_procs, engine, 30)
            stack.kill_worker(worker)  # reaps it (and ends anything the guard missed)
            ended_s = time.monotonic() - killed
            print(f"{len(engine)} engine processes ended {ended_s:.1f} s after their worker")
            await asyncio.to_thread(stack.start_worker)
            result = await guest.stream(request_id, last_event_id=first.last_id)
            return request_id, engine, left, result

    request_id, engine, left, result = asyncio.run(scenario())
    assert len(engine) >= 2, "expected vLLM's engine core and the guard"
    assert left == [], f"still running after their worker was killed: {left}"
    assert result.terminal.event == "done"
    assert result.of("reset"), "the stream was not told that the answer restarted"
    assert result.text.strip()
    assert stack.count_assistant_messages(request_id) == [("done", result.text)]
