"""Priority under saturation: a VIP request waits for one slot turnover, not for the queue."""

import asyncio

import pytest

from tests.e2e.client import ChatClient
from tests.e2e.conftest import running_stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack():
    yield from running_stack(
        INFERENCE_MAX_NUM_SEQS="4",
        VIP_RESERVED_SLOTS="0",  # normal traffic may take every slot
        SIMULATED_DECODE_BASE_S="0.05",
        SIMULATED_OUTPUT_TOKENS="40",  # about 2 s per answer
        NORMAL_AGING_S="600",
    )


def _entry_ms(event_id: str) -> int:
    return int(event_id.split("-")[0])


def test_with_every_slot_taken_by_normal_traffic_vip_starts_at_the_next_turnover(stack):
    async def scenario():
        async with ChatClient(stack.base_url) as alice, ChatClient(stack.base_url) as victor:
            await alice.login("alice", "alice-demo-pass")
            await victor.login("victor", "victor-demo-pass")
            # Staggered, so that slots free one at a time.
            running = []
            for n in range(3):
                running.append(await alice.ask(await alice.new_conversation(), f"running {n}"))
                await asyncio.sleep(0.3)
            running.append(await victor.ask(await victor.new_conversation(), "running 3"))
            await asyncio.sleep(0.3)  # all four slots are busy
            queued = [await alice.ask(await alice.new_conversation(), f"queued {n}") for n in range(3)]
            vip = await victor.ask(await victor.new_conversation(), "VIP, please hurry")
            streams = [
                *(alice.stream(r) for r in running[:3]),
                victor.stream(running[3]),
                *(alice.stream(r) for r in queued),
                victor.stream(vip),
            ]
            return await asyncio.gather(*streams)

    results = asyncio.run(scenario())
    running, queued, vip = results[:4], results[4:7], results[7]
    assert all(r.terminal.event == "done" for r in results)

    def started_ms(result) -> int:
        [start] = [e for e in result.events if e.event == "status" and e.data["state"] == "running"]
        return _entry_ms(start.id)

    first_turnover_ms = min(_entry_ms(r.terminal.id) for r in running)
    # The VIP request took the first slot that freed, ahead of the three queued before it.
    assert started_ms(vip) < min(started_ms(r) for r in queued)
    assert started_ms(vip) >= first_turnover_ms
