"""Reads of the result cache page: its figures over the live window, and the pinned answers."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

from django.db.models import QuerySet
from django.utils import timezone

from admin_console.selectors.dashboard import LIVE_WINDOW_S
from knowledge.models import CachedAnswer
from scheduler.models import CacheResult, Generation


@dataclass(frozen=True, slots=True)
class CacheFigures:
    """The result cache over the live window, from the generation records (every web process)."""

    lookups: int
    hits: dict[str, int]  # exact, semantic, pinned
    hit_rate: float | None  # 0..1; None without lookups
    saved_engine_s: float
    lookup_p50_ms: float | None
    lookup_p95_ms: float | None


def _percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))], 2)


def cache_figures(*, window_s: float = LIVE_WINDOW_S) -> CacheFigures:
    since = timezone.now() - timedelta(seconds=window_s)
    looked_up = Generation.objects.filter(created_at__gte=since).exclude(cache="")
    rows = list(looked_up.values_list("cache", "cache_lookup_ms", "saved_engine_ms"))
    hits = Counter(result for result, _, _ in rows if result != CacheResult.MISS.value)
    return CacheFigures(
        lookups=len(rows),
        hits={
            result: hits[result] for result in (CacheResult.EXACT, CacheResult.SEMANTIC, CacheResult.PINNED)
        },
        hit_rate=round(hits.total() / len(rows), 3) if rows else None,
        saved_engine_s=round(sum(saved or 0.0 for _, _, saved in rows) / 1000, 1),
        lookup_p50_ms=_percentile([ms for _, ms, _ in rows if ms is not None], 0.5),
        lookup_p95_ms=_percentile([ms for _, ms, _ in rows if ms is not None], 0.95),
    )


def pinned_answers() -> QuerySet[CachedAnswer]:
    return CachedAnswer.objects.exclude(pinned_answer="").order_by("variant", "question")
