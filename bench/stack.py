"""What every stack benchmark shares: the questions asked, the limits set out of the way, and
the product's real processes started and stopped around a scenario."""

from __future__ import annotations

import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from launcher.stack import Stack

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
    # ... and every answer is the engine's: the shipped style quotes the help center without
    # it (bench/quality.py measures the styles).
    "CHAT_ANSWER_STYLE": "generated",
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
