"""`python -m bench batching`: real vLLM through the stack at rising concurrency."""

from __future__ import annotations

import asyncio

from bench.load import SessionPool, fixed_concurrency
from bench.stack import UNLIMITED, question, running
from bench.stats import summarize


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
