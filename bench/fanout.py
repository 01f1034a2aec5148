"""`python -m bench fanout`: how many tokens the stack delivers to many streams at once, against
the bare endpoint."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
import uuid

from bench.client import Session
from bench.load import (
    SessionPool,
    hello_counter,
    open_in_waves,
    queue_requests,
    until_all_said_hello,
)
from bench.stack import UNLIMITED, running
from bench.stats import distribution

# Tokens of one stream that reach the client less than this apart arrived together: one write
# of several tokens (a relay catching up), or several writes the client read at once (the bare
# endpoint writes one token at a time). Either way the reader sees them at the same moment.
TOGETHER_S = 0.001


def _arrival_gaps(token_times: list[float]) -> list[float]:
    """The gaps a reader sees between successive arrivals of text on one stream."""
    return [b - a for a, b in itertools.pairwise(token_times) if b - a >= TOGETHER_S]


def _delivery(traces: list, started_at: float) -> dict:
    """Tokens delivered per second from the moment every stream could start; per stream, the
    time from that moment to its first and its last token; and the gaps between tokens.

    ITL is counted per arrival (`itl_s`): tokens that arrive together count once, on both sides.
    Counted per token (`itl_per_token_s`), every token after the first of a write adds a gap of
    zero, so a relay that catches up in large writes pushes the big gaps above the 99th
    percentile and looks better than one that keeps up."""
    times = [t for trace in traces for t in trace.token_times]
    per_token = [b - a for trace in traces for a, b in itertools.pairwise(trace.token_times)]
    return {
        "streams": len(traces),
        "completed": sum(trace.outcome == "done" for trace in traces),
        "tokens": len(times),
        "tokens_per_s": len(times) / (max(times) - started_at) if times else 0.0,
        "first_token_s": distribution([t.token_times[0] - started_at for t in traces if t.token_times]),
        "last_token_s": distribution([t.token_times[-1] - started_at for t in traces if t.token_times]),
        "itl_s": distribution([gap for trace in traces for gap in _arrival_gaps(trace.token_times)]),
        "itl_per_token_s": distribution(per_token),
        "longest_gap_s": distribution([max(_arrival_gaps(t.token_times), default=0.0) for t in traces]),
    }


def fanout(*, streams: list[int], tokens: int) -> dict:
    """Every stream is open before the first token flows, in both measurements, so the figure
    is the delivery rate of N concurrent streams, not the rate at which they were opened."""
    env = {
        **UNLIMITED,
        "INFERENCE_ENGINE": "simulated",
        "INFERENCE_MAX_NUM_SEQS": str(max(streams)),
        "VIP_RESERVED_SLOTS": "0",
        "SIMULATED_OUTPUT_TOKENS": str(tokens),
        "GENERATION_MAX_TOKENS": str(tokens),
        "SIMULATED_PREFILL_S_PER_TOKEN": "0",
        "SIMULATED_DECODE_BASE_S": "0",
        "SIMULATED_DECODE_PER_SEQ_S": "0",
        "SSE_STATUS_INTERVAL_S": "100000",
        "BENCH_ENDPOINTS": "true",
    }
    table: dict[int, dict] = {}
    with running(env, worker=False) as stack:

        async def collected() -> None:
            """The web process collects the garbage of the measurement before (bench/views.py)."""
            response = await Session(stack.base_url).request("POST", "/bench/collect")
            freed = response.json()
            print(f"  (the web process freed {freed['freed']:,} objects in {freed['ms']:.0f} ms)", flush=True)

        async def bare(count: int) -> dict:
            await collected()
            run = uuid.uuid4().hex
            all_open, on_status = hello_counter(count)
            tasks = await open_in_waves(
                count,
                lambda n: Session(stack.base_url).stream(
                    f"/bench/bare-sse?tokens={tokens}&run={run}", timeout_s=600, on_first_status=on_status
                ),
            )
            await until_all_said_hello(tasks, all_open)
            started_at = time.perf_counter()
            await Session(stack.base_url).request("POST", f"/bench/bare-sse/start?run={run}")
            return _delivery(await asyncio.gather(*tasks), started_at=started_at)

        async def through_stack(count: int) -> dict:
            await collected()
            pool = SessionPool(stack.base_url)
            await pool.fill("normal", count)

            submitted = await queue_requests(pool, count, "fan out")
            all_open, on_status = hello_counter(count)
            tasks = await open_in_waves(
                count,
                lambda n: submitted[n][0].stream(submitted[n][1], timeout_s=600, on_first_status=on_status),
            )
            await until_all_said_hello(tasks, all_open)
            # Every stream waits in the queue: now the worker starts and the tokens flow.
            await asyncio.to_thread(stack.start_worker)
            traces = await asyncio.gather(*tasks)
            started_at = min(t.token_times[0] for t in traces if t.token_times)
            pool.close()
            return _delivery(traces, started_at=started_at)

        for count in streams:
            # Other work on the machine shows here; the ratio, measured in the same run, is the figure.
            load_average = os.getloadavg()
            print(f"  {count} streams: bare endpoint... (load average {load_average[0]:.1f})", flush=True)
            ceiling = asyncio.run(bare(count))
            print(f"  {count} streams: through the stack...", flush=True)
            measured = asyncio.run(through_stack(count))
            for worker in list(stack.workers):
                stack.stop_worker(worker)
            table[count] = {
                "bare": ceiling,
                "stack": measured,
                "ratio": measured["tokens_per_s"] / ceiling["tokens_per_s"],
                "load_average": load_average,
            }
            print(
                f"  {count} streams: bare {ceiling['tokens_per_s']:,.0f} tok/s, stack "
                f"{measured['tokens_per_s']:,.0f} tok/s ({table[count]['ratio']:.0%}); last token p99 "
                f"bare {ceiling['last_token_s']['p99']:.2f} s, "
                f"stack {measured['last_token_s']['p99']:.2f} s; "
                f"ITL p99 per arrival bare {(ceiling['itl_s']['p99'] or 0) * 1000:.0f} ms, "
                f"stack {(measured['itl_s']['p99'] or 0) * 1000:.0f} ms "
                f"(per token {ceiling['itl_per_token_s']['p99'] * 1000:.0f} / "
                f"{measured['itl_per_token_s']['p99'] * 1000:.0f} ms); longest gap p99 "
                f"{ceiling['longest_gap_s']['p99'] * 1000:.0f} / "
                f"{measured['longest_gap_s']['p99'] * 1000:.0f} ms",
                flush=True,
            )
    return {"tokens_per_stream": tokens, "table": table}
