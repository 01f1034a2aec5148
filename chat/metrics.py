"""Prometheus objects of the hand-off: who waits for a person and who is online now, and per
variant what conversations came to over HANDOFF_MEASURES_WINDOW_S (chat.outcomes): hand-off
rate, time to the first human reply and to resolution (p50, p90), ratings, and the share the
assistant resolved on its own. Read from the database at scrape time, so every web process
reports the same numbers; the window's figures are computed at most once a minute per process.
Served by the web process's /metrics (scheduler.metrics.WEB_REGISTRY)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from django.db import DatabaseError
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from chat.handoff_selectors import waiting_snapshot
from chat.outcomes import NO_ANSWER, Outcomes, outcomes_by_variant

logger = logging.getLogger(__name__)

OUTCOMES_CACHE_S = 60.0


class HandoffCollector(Collector):
    def __init__(self) -> None:
        self._outcomes: tuple[float, list[Outcomes]] | None = None

    def forget(self) -> None:
        """Compute the window's figures afresh at the next scrape."""
        self._outcomes = None

    def _by_variant(self) -> list[Outcomes]:
        if self._outcomes is None or time.monotonic() - self._outcomes[0] >= OUTCOMES_CACHE_S:
            self._outcomes = (time.monotonic(), outcomes_by_variant())
        return self._outcomes[1]

    def collect(self) -> Iterator[Metric]:
        try:
            waiting = waiting_snapshot()
            rows = self._by_variant()
        except DatabaseError as exc:
            logger.warning("metrics: could not read the hand-offs (%s)", exc)
            return
        yield GaugeMetricFamily(
            "llm_handoff_waiting", "Conversations waiting for a person now.", value=len(waiting.positions)
        )
        yield GaugeMetricFamily(
            "llm_handoff_agents_online", "Agents with an inbox tab open now.", value=waiting.agents_online
        )
        families = {
            "conversations": GaugeMetricFamily(
                "llm_conversations",
                "Conversations started in the measures' window, by the variant of their first answer.",
                labels=["variant"],
            ),
            "handoff_rate": GaugeMetricFamily(
                "llm_handoff_rate",
                "Share of those conversations that asked for a person.",
                labels=["variant"],
            ),
            "resolved": GaugeMetricFamily(
                "llm_assistant_resolved_ratio",
                "Share of decided conversations the assistant resolved: no hand-off, no thumbs-down, no new "
                "conversation from the customer within ASSISTANT_RESOLVED_WINDOW_S.",
                labels=["variant"],
            ),
            "decided": GaugeMetricFamily(
                "llm_assistant_resolved_decided",
                "Conversations whose resolved-by-assistant is known.",
                labels=["variant"],
            ),
            "first_reply": GaugeMetricFamily(
                "llm_handoff_first_reply_seconds",
                "Time from asking for a person to their first reply.",
                labels=["variant", "quantile"],
            ),
            "resolution": GaugeMetricFamily(
                "llm_handoff_resolution_seconds",
                "Time from asking for a person to resolution.",
                labels=["variant", "quantile"],
            ),
            "rating": GaugeMetricFamily(
                "llm_handoff_rating_mean", "Mean rating (1-5) of resolved hand-offs.", labels=["variant"]
            ),
            "ratings": GaugeMetricFamily("llm_handoff_ratings", "Ratings given.", labels=["variant"]),
        }
        for row in rows:
            variant = row.label if row.label != NO_ANSWER else "none"
            families["conversations"].add_metric([variant], row.conversations)
            families["decided"].add_metric([variant], row.decided)
            families["ratings"].add_metric([variant], row.rating.n)
            for name, interval in (
                ("handoff_rate", row.handoff_rate),
                ("resolved", row.resolved_by_assistant),
                ("rating", row.rating),
            ):
                if interval.value is not None:
                    families[name].add_metric([variant], interval.value)
            for name, (p50, p90) in (
                ("first_reply", (row.first_reply_p50_s, row.first_reply_p90_s)),
                ("resolution", (row.resolution_p50_s, row.resolution_p90_s)),
            ):
                for quantile, value in (("0.5", p50), ("0.9", p90)):
                    if value is not None:
                        families[name].add_metric([variant, quantile], value)
        yield from families.values()


HANDOFF_COLLECTOR = HandoffCollector()
