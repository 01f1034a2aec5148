"""Prometheus objects of the API: each key's usage today, read from the generation records at
scrape time (so every web process reports the same numbers), and the calls this process refused
for a key's own limits. Keys are named by their prefix, as the console lists them, never by the
secret. Served by the web process's /metrics with the fleet (scheduler.metrics.WEB_REGISTRY)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.db import DatabaseError
from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from api.models import ApiKey
from api.usage import key_usage_today
from scheduler.metrics import WEB_REGISTRY

logger = logging.getLogger(__name__)

KEY_RATE_LIMITED = Counter(
    "llm_api_key_rate_limited_total",
    "Calls refused with 429 because the key was over its own requests or tokens per minute.",
    ["key", "limit"],
    registry=WEB_REGISTRY,
)


def key_rate_limited_record(*, api_key: ApiKey, limit: str) -> None:
    """`limit`: "requests" or "tokens"."""
    KEY_RATE_LIMITED.labels(api_key.prefix, limit).inc()


class ApiKeyUsageCollector(Collector):
    """Today's (UTC) usage of every key that made a request today."""

    def collect(self) -> Iterator[Metric]:
        try:
            usage = key_usage_today()
            prefixes = dict(ApiKey.objects.filter(pk__in=usage).values_list("pk", "prefix"))
        except DatabaseError as exc:
            logger.warning("metrics: could not read the API keys' usage (%s)", exc)
            return
        requests = GaugeMetricFamily(
            "llm_api_key_requests_today",
            "Requests the key had admitted today (UTC), answered or not.",
            labels=["key"],
        )
        errors = GaugeMetricFamily(
            "llm_api_key_errors_today",
            "The key's answers today (UTC) that ended in an error.",
            labels=["key"],
        )
        tokens = GaugeMetricFamily(
            "llm_api_key_tokens_today",
            "Tokens the key's answers used today (UTC), by kind (prompt, completion).",
            labels=["key", "kind"],
        )
        for key_pk, day in sorted(usage.items()):
            prefix = prefixes.get(key_pk)
            if prefix is None:
                continue  # the key was deleted
            requests.add_metric([prefix], day.requests)
            errors.add_metric([prefix], day.errors)
            tokens.add_metric([prefix, "prompt"], day.prompt_tokens)
            tokens.add_metric([prefix, "completion"], day.completion_tokens)
        yield from (requests, errors, tokens)
