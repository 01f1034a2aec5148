"""The benchmark scenarios. Each starts the product's real processes, drives them over
HTTP/SSE like browsers, and pairs its figure with a ceiling measured in the same run."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import redis.asyncio as aioredis

from bench.client import Session
from bench.load import Progress, SessionPool, fixed_concurrency, one_request, poisson
from bench.stats import RequestResult, distribution, percentile, summarize
from launcher.stack import Stack
from scheduler import keys

QUESTIONS = [
    "What is the capital of France?",
    "How do I reset my password?",
    "Can I return a product after 30 days?",
    "What are your opening hours?",
    "How long does shipping take?",
    "Do you ship to Canada?",
    "How do I cancel my subscription?",
    "Who can I call for help?",
]

# Limits out of the way: these scenarios measure the serving path, not refusals.
UNLIMITED = {
    **{f"RATE_LIMIT_{t}_CAPACITY": "1000000" for t in ("VIP", "NORMAL")},
    **{f"RATE_LIMIT_{t}_REFILL_PER_S": "100000" for t in ("VIP", "NORMAL")},
    **{f"RATE_LIMIT_{t}_TIER_CAPACITY": "1000000" for t in ("VIP", "NORMAL")},
    **{f"RATE_LIMIT_{t}_TIER_REFILL_PER_S": "100000" for t in ("VIP", "NORMAL")},
    **{f"MAX_CONCURRENT_{t}": "1000000" for t in ("VIP", "NORMAL")},
    **{f"QUEUE_MAX_{t}": "1000000" for t in ("VIP", "NORMAL")},
    **{f"WAIT_SLO_{t}_S": "1000000" for t in ("VIP", "NORMAL")},
    **{f"MAX_WAIT_{t}_S": "1000000" for t in ("VIP", "NORMAL")},
    "GLOBAL_RATE_LIMIT_CAPACITY": "1000000",
    "GLOBAL_RATE_LIMIT_REFILL_PER_S": "100000",
    # Thousands of streams from one address (and from a few clients).
    "STREAMS_MAX_PER_CLIENT": "1000000",
    "STREAMS_MAX_PER_ADDRESS": "1000000",
    "LOG_LEVEL": "WARNING",
    # The benchmarks measure the path through the engine: no question is answered from the
    # result cache (bench/answer_cache.py measures that).
    "ANSWER_CACHE_ENABLED": "false",
}


def question(n: int) -> str:
    return QUESTIONS[n % len(QUESTIONS)]


@contextmanager
def running(stack_env: dict[str, str], *, worker: bool = True):
    stack = Stack(Path(tempfile.mkdtemp(prefix="bench-")), **stack_env)
    print(f"  starting the product ({stack_env.get('INFERENCE_ENGINE', 'vllm')} engine)...", flush=True)
    started = time.perf_counter()
    stack.start(worker=worker)  # stops what it started if it fails
    print(f"  ready in {time.perf_counter() - started:.1f} s", flush=True)
    try:
        yield stack
    finally:
        stack.stop()


# --- 1. overhead ------------------------------------------------------------------------------


async def _engine_alone(
    engine: Any, *, concurrency: int, requests: int, max_tokens: int, first: int = 0
) -> tuple[list, float]:
    """The same prompts straight into the engine, in this process: the ceiling. Questions
    `first` onwards, as the stack's requests number them."""
    from django.conf import settings

    from inference.engines.base import GenerationRequest
    from knowledge.prompts import NO_HELP_CENTER_MATCH_PROMPT
    from scheduler.generation import SamplingParams

    # The prompt the stack sends: its variant's (stable: CHAT_SYSTEM_PROMPT) and what to do
    # when its help center, empty here, has nothing on the question. A shorter prompt would
    # count a longer prefill against the stack.
    stack_system_prompt = f"{settings.CHAT_SYSTEM_PROMPT}\n\n{NO_HELP_CENTER_MATCH_PROMPT}"
    results: list[RequestResult] = []
    counter = iter(range(first, first + requests))

    async def user() -> None:
        for n in counter:
            result = RequestResult(tier="engine", submitted_at=time.perf_counter(), status=202)
            request = GenerationRequest(
                request_id=f"direct-{time.time_ns()}-{n}",
                messages=[
                    {"role": "system", "content": stack_system_prompt},
                    {"role": "user", "content": question(n)},
                ],
                sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, top_p=1.0),
            )
            counted = 0
            async for delta in engine.generate(request):
                if delta.text:  # a time per token, as the stack's client counts them
                    result.token_times.extend([time.perf_counter()] * max(1, delta.output_tokens - counted))
                    counted = delta.output_tokens
            result.finished_at = time.perf_counter()
            result.outcome = "done"
            results.append(result)

    started = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(concurrency)))
    return results, time.perf_counter() - started


# vLLM's engine processes poll their shared-memory queues for a second after their last step
# (each its own core's worth on this machine), and a question that comes within it shares the
# 2 cores with them: the other engine's poller then slowed a prefill fivefold. One customer at
# a time means a pause between questions; this one outlasts the polling.
QUIET_S = 1.5


async def _alternating(
    engine: Any, pool: SessionPool, *, pairs: int, max_tokens: int, label: str
) -> list[tuple[RequestResult, RequestResult]]:
    """One customer at a time: a question straight into the engine, then the same question
    through the stack, `pairs` times, each once both engines are quiet. Side by side, a pair
    shares the machine's state of the moment (other work, the engine's caches), which the
    difference then leaves out."""
    done: list[tuple[RequestResult, RequestResult]] = []
    stack_results: list[RequestResult] = []
    async with Progress(label, stack_results, pairs):
        for n in range(pairs):
            await asyncio.sleep(QUIET_S)
            [alone], _ = await _engine_alone(
                engine, concurrency=1, requests=1, max_tokens=max_tokens, first=n
            )
            await asyncio.sleep(QUIET_S)
            through = await one_request(pool, "normal", question(n), stack_results, timeout_s=600)
            done.append((alone, through))
    return done


def _added_ttft(pairs: list[tuple[RequestResult, RequestResult]]) -> dict:
    """What the stack adds to the time to first token of one customer at a time, two ways: the
    difference within each pair (the target's measure: it also counts any slowing of the engine
    by the stack's processes beside it), and, within each request through the stack, its time
    to first token less the worker's own count of its engine call (the post, the queue and the
    token's way back alone, free of the engine's spread from one request to the next)."""
    measured = [(a, s) for a, s in pairs if a.ttft_s is not None and s.ttft_s is not None]
    through = [s for _, s in measured]
    outside = [s.ttft_s - s.engine_ttft_s for s in through if s.engine_ttft_s is not None]
    return {
        "pairs": len(measured),
        "engine_alone_ttft_s": distribution([a.ttft_s for a, _ in measured]),
        "stack_ttft_s": distribution([s.ttft_s for s in through]),
        "paired_difference_s": distribution([s.ttft_s - a.ttft_s for a, s in measured]),
        "outside_engine_s": distribution(outside),
        "outside_engine_each_s": outside,
        # Parts of it: the post until its answer (202) arrives, and the queue by the worker's
        # count; the rest is the token's way back (and the post's answer overlapping the queue).
        "post_s": distribution([s.posted_at - s.submitted_at for s in through if s.posted_at is not None]),
        "queue_s": distribution([s.queue_s for s in through if s.queue_s is not None]),
        "engine_in_worker_ttft_s": distribution([s.engine_ttft_s for s in through if s.engine_ttft_s]),
        # Each pair as it ran: the engine alone's TTFT, the stack's, and its engine call's.
        "each_pair_s": [(a.ttft_s, s.ttft_s, s.engine_ttft_s) for a, s in measured],
    }


def _answer_tokens_per_s(results: list[RequestResult]) -> float:
    """One customer at a time: the tokens of the answers over the time they took to write."""
    spans = [(len(r.token_times), r.token_times[-1] - r.token_times[0]) for r in results if r.token_times]
    return sum(tokens - 1 for tokens, _ in spans) / max(sum(span for _, span in spans), 1e-9)


def overhead(*, engine: str, rounds: int, pairs: int, concurrency: int, max_tokens: int) -> dict:
    """The same engine alone and through the whole stack: one customer at a time, in pairs (the
    first round warms both paths and is left out), and `concurrency` customers at once, in
    blocks measured back to back."""
    env = {
        **UNLIMITED,
        "INFERENCE_ENGINE": engine,
        "INFERENCE_MAX_NUM_SEQS": str(concurrency),
        "VIP_RESERVED_SLOTS": "0",
        "GENERATION_MAX_TOKENS": str(max_tokens),
        "GENERATION_TEMPERATURE": "0",
        # The engine alone samples without one: both paths write the same answers.
        "GENERATION_FREQUENCY_PENALTY": "0",
        "SIMULATED_OUTPUT_TOKENS": str(max_tokens),
    }
    os.environ.update(env)
    import django

    django.setup()
    from inference.engines import build_engine

    paired: list[list[tuple[RequestResult, RequestResult]]] = []
    runs: dict[str, list[dict]] = {"engine": [], "stack": []}
    with running(env) as stack:

        async def main() -> None:
            direct_engine = build_engine()
            print("  starting the engine alone in this process...", flush=True)
            await direct_engine.start()
            pool = SessionPool(stack.base_url)
            await pool.fill("normal", concurrency)
            for round_number in range(1, rounds + 1):
                paired.append(
                    await _alternating(
                        direct_engine,
                        pool,
                        pairs=pairs,
                        max_tokens=max_tokens,
                        label=f"round {round_number} c=1, alone and through the stack in turn",
                    )
                )
                requests = 2 * concurrency
                results, duration = await _engine_alone(
                    direct_engine, concurrency=concurrency, requests=requests, max_tokens=max_tokens
                )
                runs["engine"].append(summarize(results, duration_s=duration, ttft_slo_s=1, tpot_slo_s=1))
                print(f"  round {round_number} c={concurrency}: engine alone done", flush=True)
                results, duration = await fixed_concurrency(
                    pool,
                    concurrency=concurrency,
                    requests=requests,
                    tier="normal",
                    prompt=question,
                    timeout_s=600,
                    label=f"round {round_number} c={concurrency} stack",
                )
                runs["stack"].append(summarize(results, duration_s=duration, ttft_slo_s=1, tpot_slo_s=1))
            pool.close()
            await direct_engine.shutdown()

        asyncio.run(main())

    # The first round warms caches on both paths; report the others.
    measured = slice(1, None) if rounds > 1 else slice(None)
    one_at_a_time = [pair for pairs_of_round in paired[measured] for pair in pairs_of_round]
    added = _added_ttft(one_at_a_time)
    engine_tps = _median([r["all"]["output_tokens_per_s"] for r in runs["engine"][measured]])
    stack_tps = _median([r["all"]["output_tokens_per_s"] for r in runs["stack"][measured]])
    return {
        "engine": engine,
        "rounds": rounds,
        "max_tokens": max_tokens,
        "one_at_a_time": {
            **added,
            "engine_alone_tokens_per_s": _answer_tokens_per_s([a for a, _ in one_at_a_time]),
            "stack_tokens_per_s": _answer_tokens_per_s([s for _, s in one_at_a_time]),
        },
        "at_once": {
            "concurrency": concurrency,
            "engine_alone_ttft_p50_s": _median([r["all"]["ttft_s"]["p50"] for r in runs["engine"][measured]]),
            "stack_ttft_p50_s": _median([r["all"]["ttft_s"]["p50"] for r in runs["stack"][measured]]),
            "engine_alone_tokens_per_s": engine_tps,
            "stack_tokens_per_s": stack_tps,
            "throughput_ratio": stack_tps / engine_tps,
        },
        "runs": runs,
    }


def _median(values: list[float]) -> float:
    return percentile(values, 50) or 0.0


# --- 2. fan-out ------------------------------------------------------------------------------------


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


async def _queue_requests(pool: SessionPool, count: int, text: str) -> list[tuple[Session, str]]:
    """Post `count` messages, 50 at a time; returns each browser with its stream's path."""

    async def submit() -> tuple[Session, str]:
        session = await pool.borrow("normal")
        conversation = await session.new_conversation()
        response = await session.post_message(conversation, text)
        session.close()  # the stream opens its own connection
        return session, response.json()["stream_url"]

    submitted: list[tuple[Session, str]] = []
    for start in range(0, count, 50):
        submitted += await asyncio.gather(*(submit() for _ in range(min(50, count - start))))
        print(f"\r  queued {len(submitted)}/{count}", end="", flush=True)
    print(flush=True)
    return submitted


def _hello_counter(count: int) -> tuple[asyncio.Event, Callable[[], None]]:
    """An event set once `count` streams have sent their first status, and the callback."""
    all_open = asyncio.Event()
    said = 0

    def on_status() -> None:
        nonlocal said
        said += 1
        if said == count:
            all_open.set()

    return all_open, on_status


async def _open_in_waves(count: int, open_one) -> list[asyncio.Task]:
    """Open `count` streams a few hundred at a time: a server's listen backlog drops a flood
    of simultaneous connects, and the client would wait out TCP's retransmission timers."""
    tasks: list[asyncio.Task] = []
    for start in range(0, count, 200):
        tasks += [asyncio.create_task(open_one(n)) for n in range(start, min(count, start + 200))]
        await asyncio.sleep(0.2)
    return tasks


async def _until_all_said_hello(tasks: list[asyncio.Task], all_open: asyncio.Event) -> None:
    waiting = asyncio.create_task(all_open.wait())
    await asyncio.wait([waiting, *tasks], return_when=asyncio.FIRST_COMPLETED)
    if not all_open.is_set():
        raise RuntimeError(f"a stream ended before all were open: {[t.result() for t in tasks if t.done()]}")


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
            all_open, on_status = _hello_counter(count)
            tasks = await _open_in_waves(
                count,
                lambda n: Session(stack.base_url).stream(
                    f"/bench/bare-sse?tokens={tokens}&run={run}", timeout_s=600, on_first_status=on_status
                ),
            )
            await _until_all_said_hello(tasks, all_open)
            started_at = time.perf_counter()
            await Session(stack.base_url).request("POST", f"/bench/bare-sse/start?run={run}")
            return _delivery(await asyncio.gather(*tasks), started_at=started_at)

        async def through_stack(count: int) -> dict:
            await collected()
            pool = SessionPool(stack.base_url)
            await pool.fill("normal", count)

            submitted = await _queue_requests(pool, count, "fan out")
            all_open, on_status = _hello_counter(count)
            tasks = await _open_in_waves(
                count,
                lambda n: submitted[n][0].stream(submitted[n][1], timeout_s=600, on_first_status=on_status),
            )
            await _until_all_said_hello(tasks, all_open)
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


# --- 3. batching -----------------------------------------------------------------------------------


def batching(*, concurrencies: list[int], max_tokens: int) -> dict:
    env = {
        **UNLIMITED,
        "INFERENCE_ENGINE": "vllm",
        "INFERENCE_MAX_NUM_SEQS": str(max(concurrencies)),
        "VIP_RESERVED_SLOTS": "0",
        "GENERATION_MAX_TOKENS": str(max_tokens),
        "GENERATION_TEMPERATURE": "0",
    }
    table: dict[int, dict] = {}
    with running(env) as stack:

        async def main() -> None:
            pool = SessionPool(stack.base_url)
            await pool.fill("normal", max(concurrencies))
            await fixed_concurrency(  # warm-up
                pool,
                concurrency=1,
                requests=1,
                tier="normal",
                prompt=question,
                timeout_s=600,
                label="warm-up",
            )
            for concurrency in concurrencies:
                results, duration = await fixed_concurrency(
                    pool,
                    concurrency=concurrency,
                    requests=max(2 * concurrency, 6),
                    tier="normal",
                    prompt=question,
                    timeout_s=600,
                    label=f"c={concurrency}",
                )
                table[concurrency] = summarize(results, duration_s=duration, ttft_slo_s=2, tpot_slo_s=0.5)[
                    "all"
                ]
            pool.close()

        asyncio.run(main())
    base = table[min(concurrencies)]["output_tokens_per_s"]
    return {
        "max_tokens": max_tokens,
        "table": table,
        "speedup": {c: row["output_tokens_per_s"] / base for c, row in table.items()},
    }


# --- 4. idle streams -------------------------------------------------------------------------------


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

            submitted = await _queue_requests(pool, streams, "waiting in line")
            await asyncio.sleep(1)
            rss_before = web.memory_info().rss  # after the submissions: only the streams differ
            all_open, on_status = _hello_counter(streams)

            stop = asyncio.Event()
            tasks = await _open_in_waves(
                streams,
                lambda n: submitted[n][0].stream(
                    submitted[n][1], timeout_s=3600, on_first_status=on_status, stop=stop
                ),
            )
            await _until_all_said_hello(tasks, all_open)
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


# --- 5. scheduling under overload -----------------------------------------------------------------


async def _queue_sampler(redis_url: str, samples: list[tuple[float, dict[str, int]]]) -> None:
    from django.conf import settings

    model = settings.INFERENCE_MODEL_NAME  # the stack's one worker serves it
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    started = time.perf_counter()
    try:
        while True:
            depths = {}
            for tier in ("vip", "normal"):
                enqueued, claimed = await client.mget(
                    keys.enqueue_seq(model, tier), keys.claimed_seq(model, tier)
                )
                depths[tier] = int(enqueued or 0) - int(claimed or 0)
            samples.append((time.perf_counter() - started, depths))
            await asyncio.sleep(0.5)
    finally:
        await client.aclose()


SCHEDULING_MODES = ("policy", "preempt-at-once", "no-preemption", "fifo")


def scheduling(
    *, duration_s: float, overload: float, vip_share: float, modes: tuple[str, ...] = SCHEDULING_MODES
) -> dict:
    """2x the engine's capacity on a GPU-like simulated engine: the policy (a VIP job that finds
    every slot busy waits VIP_PREEMPT_AFTER_S for one to turn over, then preempts the youngest
    normal answer), the policy preempting at once, the policy without preemption, and plain
    FIFO."""
    slots, tokens = 16, 60
    decode_base_s, decode_per_seq_s = 0.02, 0.001
    service_s = tokens * (decode_base_s + decode_per_seq_s * slots)
    capacity_per_s = slots / service_s
    rate = overload * capacity_per_s
    engine_env = {
        "INFERENCE_ENGINE": "simulated",
        "INFERENCE_MAX_NUM_SEQS": str(slots),
        "SIMULATED_OUTPUT_TOKENS": str(tokens),
        "GENERATION_MAX_TOKENS": str(tokens),
        "SIMULATED_DECODE_BASE_S": str(decode_base_s),
        "SIMULATED_DECODE_PER_SEQ_S": str(decode_per_seq_s),
        "SERVICE_TIME_PRIOR_S": str(service_s),
        "GENERATION_TIMEOUT_S": "120",
    }
    policy = {
        **UNLIMITED,
        **engine_env,
        "VIP_RESERVED_SLOTS": "4",
        "WAIT_SLO_VIP_S": "1",
        "WAIT_SLO_NORMAL_S": "8",
        "MAX_WAIT_VIP_S": "30",
        "MAX_WAIT_NORMAL_S": "60",
        "QUEUE_MAX_NORMAL": "500",
    }
    envs = {
        "policy": policy,
        "preempt-at-once": {**policy, "VIP_PREEMPT_AFTER_S": "0"},
        "no-preemption": {**policy, "VIP_PREEMPTION": "false"},
        "fifo": {**UNLIMITED, **engine_env, "VIP_RESERVED_SLOTS": "0", "SCHEDULER_PRIORITY": "false"},
    }
    report: dict[str, Any] = {
        "offered_rate_per_s": rate,
        "engine_capacity_per_s": capacity_per_s,
        "duration_s": duration_s,
        "vip_share": vip_share,
    }
    for mode in modes:
        with running(envs[mode]) as stack:

            async def main(label: str) -> tuple[list[RequestResult], float, list]:
                pool = SessionPool(stack.base_url)
                await pool.fill("vip", 200)
                await pool.fill("normal", 400)
                samples: list[tuple[float, dict[str, int]]] = []
                sampler = asyncio.create_task(_queue_sampler(stack.redis.url, samples))
                rng = random.Random(11)
                results, duration = await poisson(
                    pool,
                    rate_per_s=rate,
                    duration_s=duration_s,
                    tier_of=lambda rng=rng: "vip" if rng.random() < vip_share else "normal",
                    prompt=question,
                    timeout_s=90,
                    label=label,
                )
                sampler.cancel()
                pool.close()
                return results, duration, samples

            results, duration, samples = asyncio.run(main(mode))
            summary = summarize(results, duration_s=duration, ttft_slo_s=1.5, tpot_slo_s=0.2)
            summary["queue_depth"] = samples
            summary["ttft_samples"] = {
                tier: sorted(r.ttft_s for r in results if r.tier == tier and r.ttft_s is not None)
                for tier in ("vip", "normal")
            }
            report[mode] = summary
    return report


# --- 6. console: polling against the live socket ------------------------------------------------

CONSOLE_POLL_S = 2.0  # the htmx fallback's interval (templates/admin_console/_live_summary.html)


async def _poll_tab(session: Session, seen: dict[str, float], stop_at: float, markers: list[str]) -> None:
    """A tab polling /console/live as htmx does, from a random phase."""
    await asyncio.sleep(random.uniform(0, CONSOLE_POLL_S))
    while time.time() < stop_at:
        started = time.time()
        body = (await session.request("GET", "/console/live", headers={"HX-Request": "true"})).body
        for marker in markers:
            if marker not in seen and marker.encode() in body:
                seen[marker] = time.time()
        await asyncio.sleep(max(0.0, CONSOLE_POLL_S - (time.time() - started)))


async def _socket_tab(
    base_url: str, cookie: str, seen: dict[str, float], stop_at: float, markers: list[str]
) -> None:
    import websockets

    url = base_url.replace("http://", "ws://") + "/console/live/socket"
    headers = {"Cookie": cookie, "Origin": base_url}
    async with websockets.connect(url, additional_headers=headers, max_size=None) as socket:
        while time.time() < stop_at:
            try:
                snapshot = await asyncio.wait_for(socket.recv(), timeout=max(0.1, stop_at - time.time()))
            except TimeoutError:
                break
            for marker in markers:
                if marker not in seen and marker in snapshot:
                    seen[marker] = time.time()


def console(*, tabs: list[int], window_s: float, refusals: int) -> dict:
    """Staff tabs on the live dashboard, polling (htmx, every 2 s) against the socket (one pushed
    snapshot per second): the web process's CPU, Redis commands per second, and the time from a
    refusal being recorded to each tab holding it."""
    import redis as sync_redis_lib

    env = {**UNLIMITED, "INFERENCE_ENGINE": "simulated"}
    import django

    django.setup()
    from scheduler import timeseries  # its module reaches the models: once Django is set up

    rows: dict[str, dict] = {}
    with running(env) as stack:
        web = psutil.Process(stack.web.pid)
        store = sync_redis_lib.Redis.from_url(stack.redis.url, decode_responses=True)

        def record_refusal(reason: str) -> float:
            # What admission writes on a refusal (scheduler.timeseries.refusal_record).
            now = time.time()
            store.hincrby(keys.series_bucket(timeseries.bucket_start(now)), f"refused:{reason}", 1)
            return now

        async def measure(mode: str, count: int) -> dict:
            staff = Session(stack.base_url)
            await staff.login("sam", "sam-demo-pass")
            markers = [f"bench_{mode}_{count}_{n}_{uuid.uuid4().hex[:6]}" for n in range(refusals)]
            seen: list[dict[str, float]] = [{} for _ in range(count)]
            warmup_s = 3.0
            stop_at = time.time() + warmup_s + window_s
            if mode == "poll":
                sessions = [Session(stack.base_url) for _ in range(count)]
                for session in sessions:
                    session.cookies = dict(staff.cookies)
                tasks = [_poll_tab(s, seen[n], stop_at, markers) for n, s in enumerate(sessions)]
            else:
                cookie = "; ".join(f"{k}={v}" for k, v in staff.cookies.items())
                tasks = [_socket_tab(stack.base_url, cookie, seen[n], stop_at, markers) for n in range(count)]
            running_tabs = asyncio.gather(*tasks)
            await asyncio.sleep(warmup_s)
            cpu_before = sum(web.cpu_times()[:2])
            commands_before = int(store.info("stats")["total_commands_processed"])
            started = time.time()
            recorded = {}
            for n, marker in enumerate(markers):
                await asyncio.sleep(max(0.0, started + (n + 0.5) * window_s / refusals - time.time()))
                recorded[marker] = record_refusal(marker)
            await running_tabs
            elapsed = time.time() - started
            cpu = sum(web.cpu_times()[:2]) - cpu_before
            commands = int(store.info("stats")["total_commands_processed"]) - commands_before
            delays = [tab[m] - recorded[m] for tab in seen for m in markers if m in tab]
            missed = sum(1 for tab in seen for m in markers if m not in tab)
            return {
                "tabs": count,
                "mode": mode,
                "web_cpu_percent": round(100 * cpu / elapsed, 1),
                "redis_commands_per_s": round(commands / elapsed, 1),
                "refusal_to_tab_s": distribution(delays),
                "refusal_to_tab_max_s": round(max(delays), 3) if delays else None,
                "missed": missed,
            }

        idle_cpu = sum(web.cpu_times()[:2])
        idle_commands = int(store.info("stats")["total_commands_processed"])
        time.sleep(window_s)
        rows["idle"] = {
            "web_cpu_percent": round(100 * (sum(web.cpu_times()[:2]) - idle_cpu) / window_s, 1),
            "redis_commands_per_s": round(
                (int(store.info("stats")["total_commands_processed"]) - idle_commands) / window_s, 1
            ),
        }
        for count in tabs:
            for mode in ("poll", "socket"):
                row = asyncio.run(measure(mode, count))
                rows[f"{mode}-{count}"] = row
                print(
                    f"{mode:<6} tabs {count:3}  web CPU {row['web_cpu_percent']:5.1f} %  "
                    f"Redis {row['redis_commands_per_s']:7.1f} cmd/s  refusal→tab p50 "
                    f"{row['refusal_to_tab_s']['p50']:.2f} s max {row['refusal_to_tab_max_s']:.2f} s  "
                    f"missed {row['missed']}",
                    flush=True,
                )
    return {"window_s": window_s, "refusals_per_run": refusals, "rows": rows}
