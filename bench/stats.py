"""Per-request latency metrics (TTFT, TPOT, ITL, end-to-end) and per-run summaries."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class RequestResult:
    tier: str
    submitted_at: float  # perf_counter when the request was sent
    status: int  # HTTP status of the submission (202 = accepted)
    token_times: list[float] = field(default_factory=list)
    finished_at: float | None = None
    outcome: str = "refused"  # done | error:<code> | timeout | disconnected | refused
    queue_s: float | None = None  # in the queue, by the worker's count (excludes posting, relay)
    engine_ttft_s: float | None = None  # the worker's engine call until its first token
    posted_at: float | None = None  # perf_counter when the post's answer (202) arrived

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.submitted_at if self.token_times else None

    @property
    def tpot_s(self) -> float | None:
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)

    @property
    def itls_s(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False)]

    @property
    def e2e_s(self) -> float | None:
        return self.finished_at - self.submitted_at if self.finished_at is not None else None


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def distribution(values: list[float]) -> dict[str, float | None]:
    return {
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "mean": sum(values) / len(values) if values else None,
        "n": len(values),
    }


def summarize(
    results: list[RequestResult],
    *,
    duration_s: float,
    ttft_slo_s: float,
    tpot_slo_s: float,
) -> dict:
    """The run's figures, overall and per tier, as `vllm bench serve` reports them."""

    def block(rs: list[RequestResult]) -> dict:
        done = [r for r in rs if r.outcome == "done"]
        accepted = [r for r in rs if r.status == 202]
        tokens = sum(len(r.token_times) for r in done)
        good = [
            r
            for r in done
            if r.ttft_s is not None and r.ttft_s <= ttft_slo_s and (r.tpot_s or 0) <= tpot_slo_s
        ]
        return {
            "requests": len(rs),
            "accepted": len(accepted),
            "completed": len(done),
            "refused_429": sum(r.status == 429 for r in rs),
            "refused_503": sum(r.status == 503 for r in rs),
            "other_status": sum(r.status not in (202, 429, 503) for r in rs),
            "timed_out": sum(r.outcome in ("timeout", "error:timeout", "error:expired") for r in accepted),
            "errors": sum(r.outcome.startswith("error") for r in accepted),
            "silent_drops": sum(r.outcome in ("disconnected", "closed", "open") for r in accepted),
            "request_throughput_per_s": len(done) / duration_s,
            "output_tokens_per_s": tokens / duration_s,
            "goodput_per_s": len(good) / duration_s,
            "ttft_s": distribution([r.ttft_s for r in done if r.ttft_s is not None]),
            "queue_s": distribution([r.queue_s for r in done if r.queue_s is not None]),
            "tpot_s": distribution([r.tpot_s for r in done if r.tpot_s is not None]),
            "itl_s": distribution([itl for r in done for itl in r.itls_s]),
            "e2e_s": distribution([r.e2e_s for r in done if r.e2e_s is not None]),
        }

    tiers = sorted({r.tier for r in results})
    return {
        "duration_s": duration_s,
        "slo": {"ttft_s": ttft_slo_s, "tpot_s": tpot_slo_s},
        "all": block(results),
        "per_tier": {tier: block([r for r in results if r.tier == tier]) for tier in tiers},
    }
