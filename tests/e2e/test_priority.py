"""Priority under saturation: a VIP request arriving to a full worker starts before any slot
turns over, and the normal answer it preempted still completes, with no restart."""

import asyncio

import pytest

from tests.e2e.client import ChatClient
from tests.e2e.conftest import running_stack

pytestmark = pytest.mark.e2e

OUTPUT_TOKENS = 40


@pytest.fixture(scope="module")
def stack():
    yield from running_stack(
        INFERENCE_MAX_NUM_SEQS="4",
        VIP_RESERVED_SLOTS="0",  # normal traffic may take every slot
        SIMULATED_DECODE_BASE_S="0.05",
        SIMULATED_OUTPUT_TOKENS=str(OUTPUT_TOKENS),  # about 2 s per answer
        NORMAL_AGING_S="600",
    )


def _entry_ms(event_id: str) -> int:
    return int(event_id.split("-")[0])


def test_a_vip_request_to_a_full_worker_starts_before_any_slot_turns_over(stack):
    async def scenario():
        async with ChatClient(stack.base_url) as alice, ChatClient(stack.base_url) as victor:
            await alice.login("alice", "alice-demo-pass")
            await victor.login("victor", "victor-demo-pass")
            running = []
            for n in range(4):
                running.append(await alice.ask(await alice.new_conversation(), f"running {n}"))
                await asyncio.sleep(0.3)
            # All four slots are busy with normal answers, and more normal work is queued.
            queued = [await alice.ask(await alice.new_conversation(), f"queued {n}") for n in range(2)]
            vip = await victor.ask(await victor.new_conversation(), "VIP, please hurry")
            streams = [*(alice.stream(r) for r in [*running, *queued]), victor.stream(vip)]
            return await asyncio.gather(*streams)

    results = asyncio.run(scenario())
    running, queued, vip = results[:4], results[4:6], results[6]
    assert all(r.terminal.event == "done" for r in results)

    first_vip_token_ms = _entry_ms(vip.of("token")[0].id)
    first_turnover_ms = min(_entry_ms(r.terminal.id) for r in running)
    assert first_vip_token_ms < first_turnover_ms
    assert first_vip_token_ms < min(_entry_ms(r.of("token")[0].id) for r in queued)

    # Every normal answer, the paused one included, is whole: each token once, in order, no
    # restart, and as long as an unpaused one.
    for n, result in enumerate(running):
        assert not result.of("reset")
        assert [e.data["seq"] for e in result.of("token")] == list(range(OUTPUT_TOKENS))
        assert result.text.startswith(f"[simulated] You asked: running {n} ")
        assert result.terminal.data["usage"]["completion_tokens"] == OUTPUT_TOKENS
