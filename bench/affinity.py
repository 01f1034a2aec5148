"""Conversation affinity with two real vLLM workers: customers holding conversations of 4 to 6
turns, with a turn left briefly to the worker that answered the conversation's previous one
(AFFINITY_WAIT_S=0.25, as shipped) and without (0); TTFT of the later turns and the workers' prefix-cache hit
rate, read from their heartbeats (vLLM's own counts). With `help_center`, the demo help center
is imported and the customers ask the tuning set's English questions, so that each turn's
prompt carries the excerpts found for it, as the chat's do; only the turns a model answered
are timed (a decline is written without one)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import redis.asyncio as aioredis

from bench.client import Session
from bench.stack import UNLIMITED, question, running
from bench.stats import distribution
from launcher.process import ROOT
from scheduler import keys

WORKERS = 2
CUSTOMERS = 6  # conversations under way at once
THINK_S = 1.0
ENGINE = {
    **UNLIMITED,
    "INFERENCE_ENGINE": "vllm",
    "CHAT_ANSWER_STYLE": "generated",  # every turn the model's: its prompt holds the conversation
    "GENERATION_MAX_TOKENS": "48",
    "GENERATION_TIMEOUT_S": "600",
}
MODES = {"affinity": {"AFFINITY_WAIT_S": "0.25"}, "none": {"AFFINITY_WAIT_S": "0"}}
DEMO_HELP_CENTER = ROOT / "knowledge" / "demo_help_center"


def _help_center_questions() -> list[str]:
    """The tuning set's English questions that the help center answers."""
    import django

    django.setup()
    from knowledge.quality import conversations_load

    return [
        turn.question
        for conversation in conversations_load(["tuning"])
        if conversation.language == "en"
        for turn in conversation.turns
        if turn.expect == "answer"
    ]


async def _prefix_cache(redis_url: str) -> tuple[int, int]:
    """The live workers' prefix-cache lookups and hits, summed (tokens, since each started)."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        queries = hits = 0
        for worker in await client.zrange(keys.WORKERS_INDEX, 0, -1):
            beat = await client.get(keys.worker_heartbeat(worker))
            if beat:
                state = json.loads(beat)
                queries += state.get("prefix_cache_queries", 0)
                hits += state.get("prefix_cache_hits", 0)
        return queries, hits
    finally:
        await client.aclose()


async def _customer(
    base_url: str,
    asked: list[str],
    ttfts: list[tuple[int, float]],
    declined: list[int],
    queued: list[tuple[int, float]],
) -> None:
    session = Session(base_url)
    try:
        conversation = await session.open_page()
        for turn, text in enumerate(asked):
            sent = time.perf_counter()
            response = await session.post_message(conversation, text)
            if response.status != 202:
                raise RuntimeError(f"a turn was refused: {response.status} {response.body!r}")
            trace = await session.stream(response.json()["stream_url"], timeout_s=600)
            if trace.usage is not None and trace.usage.prompt_tokens == 0:
                declined.append(turn)  # written without a model: no engine to time
            elif trace.token_times:
                ttfts.append((turn, trace.token_times[0] - sent))
                if trace.queue_s is not None:  # the worker's count: enqueued until claimed
                    queued.append((turn, trace.queue_s))
            await asyncio.sleep(THINK_S)
    finally:
        session.close()


async def _phase(
    base_url: str, redis_url: str, *, conversations: int, seed: int, questions: list[str]
) -> dict[str, Any]:
    rng = random.Random(seed)
    turns = [rng.randint(4, 6) for _ in range(conversations)]
    if questions:  # the same questions in both modes of a run
        asked = [rng.sample(questions, count) for count in turns]
    else:
        asked = [[question(n + turn) for turn in range(count)] for n, count in enumerate(turns)]
    declined: list[int] = []
    queued: list[tuple[int, float]] = []
    ttfts: list[tuple[int, float]] = []
    queries_before, hits_before = await _prefix_cache(redis_url)
    pending = list(asked)
    running_now: set[asyncio.Task] = set()
    while pending or running_now:
        while pending and len(running_now) < CUSTOMERS:
            running_now.add(asyncio.create_task(_customer(base_url, pending.pop(0), ttfts, declined, queued)))
        done, running_now = await asyncio.wait(running_now, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
    await asyncio.sleep(2.5)  # a heartbeat or two: the last turns' lookups counted
    queries_after, hits_after = await _prefix_cache(redis_url)
    queries = queries_after - queries_before
    return {
        "turns": len(ttfts),
        "declined_turns": len(declined),
        "ttft_later_turns_s": distribution([s for turn, s in ttfts if turn >= 1]),
        "ttft_all_turns_s": distribution([s for _, s in ttfts]),
        "queued_later_turns_s": distribution([s for turn, s in queued if turn >= 1]),
        "prefix_cache_queries": queries,
        "prefix_cache_hit_rate": (hits_after - hits_before) / queries if queries else None,
    }


def affinity(*, runs: int, conversations: int, help_center: bool) -> dict[str, Any]:
    report: dict[str, Any] = {
        "workers": WORKERS,
        "customers": CUSTOMERS,
        "conversations": conversations,
        "help_center": help_center,
        "runs": [],
    }
    questions = _help_center_questions() if help_center else []
    for run in range(1, runs + 1):
        row: dict[str, Any] = {}
        for mode, env in MODES.items():
            with running({**ENGINE, **env}) as stack:
                if help_center:
                    imported = stack.manage("import_articles", str(DEMO_HELP_CENTER))
                    if imported.returncode != 0:
                        raise RuntimeError(f"importing the help center failed: {imported.stderr}")
                for _ in range(WORKERS - 1):
                    stack.start_worker()
                print(f"  run {run}: {mode}", flush=True)
                row[mode] = asyncio.run(
                    _phase(
                        stack.base_url,
                        stack.redis.url,
                        conversations=conversations,
                        seed=run,
                        questions=questions,
                    )
                )
        report["runs"].append(row)
    return report
