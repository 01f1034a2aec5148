"""Prometheus objects of the result cache (knowledge/cache.py), served by the web process's
/metrics (scheduler.metrics.WEB_REGISTRY). Per process: sum them over the web processes."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from scheduler.metrics import WEB_REGISTRY

CACHE_LOOKUPS = Counter(
    "llm_answer_cache_lookups_total",
    "First-turn questions looked up in the result cache, by variant and result: miss, exact, "
    "semantic or pinned. Hit rate: the hits over all lookups.",
    ["variant", "result"],
    registry=WEB_REGISTRY,
)
CACHE_SAVED_ENGINE_SECONDS = Counter(
    "llm_answer_cache_saved_engine_seconds_total",
    "Engine time the answers served from the cache took when they were generated.",
    ["variant"],
    registry=WEB_REGISTRY,
)
CACHE_LOOKUP_SECONDS = Histogram(
    "llm_answer_cache_lookup_seconds",
    "Time a lookup adds to a first-turn question (the question's embedding is shared with "
    "retrieval and not counted).",
    buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1),
    registry=WEB_REGISTRY,
)


def lookup_observe(*, variant: str, result: str, lookup_ms: float, saved_engine_ms: float) -> None:
    CACHE_LOOKUPS.labels(variant, result).inc()
    CACHE_LOOKUP_SECONDS.observe(lookup_ms / 1000)
    if saved_engine_ms:
        CACHE_SAVED_ENGINE_SECONDS.labels(variant).inc(saved_engine_ms / 1000)
