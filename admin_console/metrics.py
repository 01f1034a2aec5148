"""Prometheus objects of the console: canary rollbacks, counted from the rollouts it records.

Served by the web process's /metrics with the fleet (scheduler.metrics.WEB_REGISTRY); the
split itself is exported there, from the routing mirror in Redis.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.db import DatabaseError
from django.db.models import Count
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from admin_console.models import CanaryRollout

logger = logging.getLogger(__name__)


class CanaryRollbacksCollector(Collector):
    """Rolled-back rollouts in the database, by trigger (automatic: the evaluation; manual:
    staff). Counted from the records rather than in memory, so every web process reports the
    same total and a restart does not reset it."""

    def collect(self) -> Iterator[Metric]:
        try:
            counts = dict(
                CanaryRollout.objects.filter(status=CanaryRollout.Status.ROLLED_BACK)
                .values_list("automatic")
                .annotate(Count("id"))
            )
        except DatabaseError as exc:
            logger.warning("metrics: could not count canary rollbacks (%s)", exc)
            return
        rollbacks = CounterMetricFamily(
            "llm_canary_rollbacks_total", "Canary rollouts rolled back, by trigger.", labels=["trigger"]
        )
        rollbacks.add_metric(["automatic"], counts.get(True, 0))
        rollbacks.add_metric(["manual"], counts.get(False, 0))
        yield rollbacks
