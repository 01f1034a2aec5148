"""`python -m bench overhead`: the same engine alone and through the whole stack, in pairs."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from bench.load import Progress, SessionPool, fixed_concurrency, one_request
from bench.stack import UNLIMITED, question, running
from bench.stats import RequestResult, distribution, percentile, summarize


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
