"""Prometheus objects of client addresses, served by the web process's /metrics with the fleet
(scheduler.metrics.WEB_REGISTRY)."""

from __future__ import annotations

from prometheus_client import Counter

from scheduler.metrics import WEB_REGISTRY

FORWARDED_FOR_UNTRUSTED = Counter(
    "llm_forwarded_for_untrusted_total",
    "Requests with X-Forwarded-For from a peer not in TRUSTED_PROXIES: the header was ignored, so "
    "clients behind that proxy share its address in the rate limits and sign-in throttle.",
    registry=WEB_REGISTRY,
)
