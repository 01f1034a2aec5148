"""`python -m bench scheduling`: overload with VIP and normal traffic under each scheduling
mode."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import redis.asyncio as aioredis

from bench.load import SessionPool, poisson
from bench.stack import UNLIMITED, question, running
from bench.stats import RequestResult, summarize
from scheduler import keys


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
