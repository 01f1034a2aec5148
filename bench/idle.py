"""`python -m bench idle`: thousands of customers waiting in the queue, each stream held open
with heartbeats."""

from __future__ import annotations

import asyncio

import psutil

from bench.load import (
    SessionPool,
    hello_counter,
    open_in_waves,
    queue_requests,
    until_all_said_hello,
)
from bench.stack import UNLIMITED, running
from bench.stats import distribution


def idle(*, streams: int, hold_s: float, heartbeat_s: float) -> dict:
    env = {
        **UNLIMITED,
        "INFERENCE_ENGINE": "simulated",
        "SSE_HEARTBEAT_S": str(heartbeat_s),
        "SSE_STATUS_INTERVAL_S": "100000",  # heartbeats only: status events would reset the timer
    }
    with running(env, worker=False) as stack:
        web = psutil.Process(stack.web.pid)

        async def main() -> dict:
            pool = SessionPool(stack.base_url)
            await pool.fill("normal", streams)
            warm = await pool.borrow("normal")
            await warm.new_conversation()
            pool.give_back("normal", warm)

            submitted = await queue_requests(pool, streams, "waiting in line")
            await asyncio.sleep(1)
            rss_before = web.memory_info().rss  # after the submissions: only the streams differ
            all_open, on_status = hello_counter(streams)

            stop = asyncio.Event()
            tasks = await open_in_waves(
                streams,
                lambda n: submitted[n][0].stream(
                    submitted[n][1], timeout_s=3600, on_first_status=on_status, stop=stop
                ),
            )
            await until_all_said_hello(tasks, all_open)
            await asyncio.sleep(1)
            rss_open = web.memory_info().rss
            print(f"\n  holding {streams} open streams for {hold_s:.0f} s...", flush=True)
            await asyncio.sleep(hold_s)
            stop.set()
            traces = await asyncio.gather(*tasks)
            lateness = []
            for trace in traces:
                previous = trace.first_status_at
                for beat in trace.heartbeat_times:
                    if previous is not None:
                        lateness.append(beat - previous - heartbeat_s)
                    previous = beat
            return {
                "streams": streams,
                "web_rss_before_mb": rss_before / 2**20,
                "web_rss_open_mb": rss_open / 2**20,
                "memory_per_stream_kb": (rss_open - rss_before) / streams / 1024,
                "heartbeats": len(lateness),
                "heartbeat_lateness_s": distribution(lateness),
                "heartbeat_lateness_max_s": max(lateness) if lateness else None,
                "lateness_samples": lateness,
            }

        return asyncio.run(main())
