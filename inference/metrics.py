"""Prometheus objects of the inference worker, and the HTTP endpoint that serves them.

Each worker measures its own answers (TTFT, inter-token latency, end-to-end latency, queue
wait, output tokens, outcomes) and serves them on WORKER_METRICS_PORT; Prometheus scrapes
every worker and aggregates. Nothing here runs per token: one answer is recorded once, when it
ends. What the fleet looks like (queues, heartbeats) is exported by the web process instead.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from prometheus_client import REGISTRY, Counter, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from scheduler import keys
from scheduler.metrics import scrape_refusal
from scheduler.services import GenerationOutcome

logger = logging.getLogger(__name__)

LABELS = ["variant", "tier"]
# Latencies from a few ms (one decode step on a GPU) to minutes (a long answer on a CPU).
_LATENCY_BUCKETS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
_ITL_BUCKETS_S = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5)
_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)

# How an answer ended: a message status (done, cancelled) or its error code. `error` is an
# attempt that raised and is retried after its lease; `failed` one dead-lettered after its
# attempts ran out.
OUTCOMES = ("done", "cancelled", "expired", "timeout", "engine_error", "failed", "error")

QUEUE_WAIT = Histogram(
    "llm_queue_wait_seconds",
    "From enqueue to the start of generation (claim included), for every answer started.",
    LABELS,
    buckets=_LATENCY_BUCKETS_S,
)
TIME_TO_FIRST_TOKEN = Histogram(
    "llm_time_to_first_token_seconds",
    "From the start of generation to the first token (prefill and engine scheduling; the queue "
    "wait is llm_queue_wait_seconds).",
    LABELS,
    buckets=_LATENCY_BUCKETS_S,
)
INTER_TOKEN_LATENCY = Histogram(
    "llm_inter_token_latency_seconds",
    "Mean time between output tokens of one completed answer: (duration - TTFT) / (tokens - 1).",
    LABELS,
    buckets=_ITL_BUCKETS_S,
)
END_TO_END_LATENCY = Histogram(
    "llm_end_to_end_latency_seconds",
    "From enqueue to the last token of a completed answer: what the user waited in all.",
    LABELS,
    buckets=_LATENCY_BUCKETS_S,
)
OUTPUT_TOKENS = Histogram(
    "llm_output_tokens",
    "Output tokens of a completed answer; rate(llm_output_tokens_sum) is tokens per second.",
    LABELS,
    buckets=_TOKEN_BUCKETS,
)
GENERATIONS = Counter(
    "llm_generations_total",
    "Answers ended, by outcome: " + ", ".join(OUTCOMES) + ".",
    [*LABELS, "outcome"],
)
JOBS_RECLAIMED = Counter(
    "llm_jobs_reclaimed_total",
    "Jobs of a dead worker whose expired lease this worker took over.",
    ["model"],
)
JOBS_DEAD_LETTERED = Counter(
    "llm_jobs_dead_lettered_total",
    "Jobs this worker moved to the dead-letter stream after they used up their attempts.",
    ["model"],
)
PREEMPTIONS = Counter(
    "llm_preemptions_total",
    "Answers paused to give their slot to a VIP job (they resume from their streamed text), by "
    "the paused answer's tier.",
    LABELS,
)
FAIR_SHARE_PREEMPTIONS = Counter(
    "llm_fair_share_preemptions_total",
    "Answers paused to give their slot to a job of a source served less (fair share), by the "
    "paused answer's tier.",
    LABELS,
)
_HISTOGRAMS = (QUEUE_WAIT, TIME_TO_FIRST_TOKEN, INTER_TOKEN_LATENCY, END_TO_END_LATENCY, OUTPUT_TOKENS)


def answer_observe(*, variant: str, tier: str, outcome: GenerationOutcome) -> None:
    """Record one ended answer; its timings (ms) are absent when no generation ran.

    Inter-token latency is the answer's mean rather than one sample per token: it costs one
    observation per answer instead of a call on the per-token path, and it is the streaming
    speed the user saw (a stall inside one answer shows in its end-to-end latency instead).
    """
    GENERATIONS.labels(variant, tier, outcome.error_code or outcome.status).inc()
    timings = outcome.timings
    if timings is None:
        return
    labels = (variant, tier)
    QUEUE_WAIT.labels(*labels).observe(max(0.0, timings.queue_ms / 1000))
    ttft_ms = timings.ttft_ms
    if ttft_ms is not None:
        TIME_TO_FIRST_TOKEN.labels(*labels).observe(ttft_ms / 1000)
    if outcome.status != "done":
        return  # a cut-short answer's duration and length say nothing about speed
    output_tokens = outcome.usage.completion_tokens
    END_TO_END_LATENCY.labels(*labels).observe((timings.queue_ms + timings.duration_ms) / 1000)
    OUTPUT_TOKENS.labels(*labels).observe(output_tokens)
    if ttft_ms is not None and output_tokens > 1:
        itl_s = (timings.duration_ms - ttft_ms) / 1000 / (output_tokens - 1)
        INTER_TOKEN_LATENCY.labels(*labels).observe(itl_s)


_variants_seen: set[str] = set()


def series_init(model: str) -> None:
    """Create the worker's series at zero, so that the first of each is an increase that
    rate() and the alerts see, not the start of a new series."""
    JOBS_RECLAIMED.labels(model)
    JOBS_DEAD_LETTERED.labels(model)


def variant_series_init(variant: str) -> None:
    """Likewise for a variant's answers, when the worker first starts one of its jobs (the
    worker learns the variants of its model from the jobs)."""
    if variant in _variants_seen:
        return
    _variants_seen.add(variant)
    for tier in keys.TIERS:
        for outcome in OUTCOMES:
            GENERATIONS.labels(variant, tier, outcome)
        for histogram in _HISTOGRAMS:
            histogram.labels(variant, tier)
        PREEMPTIONS.labels(variant, tier)
        FAIR_SHARE_PREEMPTIONS.labels(variant, tier)


# --- the worker's endpoint ----------------------------------------------------------------------

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """A scrape every few seconds would drown the worker's log."""


def _guarded(app: WsgiApp) -> WsgiApp:
    """The web's /metrics rule (scheduler.metrics.scrape_refusal) in front of the exporter."""

    def guarded_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        refusal = scrape_refusal(
            authorization=environ.get("HTTP_AUTHORIZATION"),
            peer_address=environ.get("REMOTE_ADDR", ""),
            forwarded_for=environ.get("HTTP_X_FORWARDED_FOR", environ.get("HTTP_FORWARDED")),
        )
        if refusal is None:
            return app(environ, start_response)
        headers = [("Content-Type", "text/plain; charset=utf-8")]
        if refusal == HTTPStatus.UNAUTHORIZED:
            headers.append(("WWW-Authenticate", 'Bearer realm="metrics"'))
        start_response(f"{refusal.value} {refusal.phrase}", headers)
        return [f"{refusal.phrase}: see METRICS_TOKEN and METRICS_ALLOWED_NETWORKS.\n".encode()]

    return guarded_app


def exporter_start(*, addr: str, port: int) -> WSGIServer:
    """Serve this process's metrics at http://addr:port/ from a daemon thread (port 0: any
    free port, see the returned server's `server_port`)."""

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET

    try:
        server = make_server(
            addr, port, _guarded(make_wsgi_app(REGISTRY)), Server, handler_class=_QuietHandler
        )
    except OSError as exc:
        raise ImproperlyConfigured(
            f"The worker's metrics exporter cannot listen on {addr}:{port} ({exc}). Workers sharing "
            "a host need a WORKER_METRICS_PORT each; 0 turns the exporter off."
        ) from exc
    threading.Thread(target=server.serve_forever, name="metrics-exporter", daemon=True).start()
    return server


def worker_exporter_start() -> WSGIServer | None:
    """Start the exporter as configured (WORKER_METRICS_PORT 0: off) with the worker's series."""
    if not settings.WORKER_METRICS_PORT:
        return None
    series_init(settings.INFERENCE_MODEL_NAME)
    server = exporter_start(addr=settings.WORKER_METRICS_ADDR, port=settings.WORKER_METRICS_PORT)
    host = settings.WORKER_METRICS_ADDR
    logger.info("metrics at http://%s:%d/metrics", f"[{host}]" if ":" in host else host, server.server_port)
    return server
