"""PNG figures for the benchmark report (matplotlib, drawn without a display)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def overhead(report: dict, path: Path) -> Path:
    concurrencies = sorted(report["table"])
    rows = [report["table"][c] for c in concurrencies]
    figure, (ttft, tps) = plt.subplots(1, 2, figsize=(10, 4))
    x = range(len(concurrencies))
    width = 0.38
    ttft.bar(
        [i - width / 2 for i in x], [r["engine_alone_ttft_p50_ms"] for r in rows], width, label="engine alone"
    )
    ttft.bar(
        [i + width / 2 for i in x], [r["stack_ttft_p50_ms"] for r in rows], width, label="through the stack"
    )
    ttft.set(
        xticks=list(x),
        xticklabels=[f"c={c}" for c in concurrencies],
        ylabel="TTFT p50 (ms)",
        title="Time to first token",
    )
    tps.bar(
        [i - width / 2 for i in x],
        [r["engine_alone_tokens_per_s"] for r in rows],
        width,
        label="engine alone",
    )
    tps.bar(
        [i + width / 2 for i in x], [r["stack_tokens_per_s"] for r in rows], width, label="through the stack"
    )
    tps.set(
        xticks=list(x),
        xticklabels=[f"c={c}" for c in concurrencies],
        ylabel="output tokens/s",
        title="Throughput",
    )
    tps.legend()
    figure.suptitle(f"Overhead of the stack ({report['engine']} engine)")
    return _save(figure, path)


def fanout(report: dict, path: Path) -> Path:
    counts = sorted(report["table"])
    rows = [report["table"][c] for c in counts]
    figure, (tps, itl) = plt.subplots(1, 2, figsize=(10, 4))
    tps.plot(counts, [r["bare"]["tokens_per_s"] for r in rows], "o-", label="bare Django SSE (ceiling)")
    tps.plot(counts, [r["stack"]["tokens_per_s"] for r in rows], "o-", label="through the stack")
    tps.set(xlabel="concurrent streams", ylabel="tokens/s delivered", title="Fan-out throughput")
    tps.legend()
    # Not ITL: a relay that fell behind writes several tokens at once, so gaps of zero would
    # flatter it. The time until a stream has its whole answer cannot be flattered.
    itl.plot(counts, [r["bare"]["last_token_s"]["p99"] for r in rows], "o-", label="bare")
    itl.plot(counts, [r["stack"]["last_token_s"]["p99"] for r in rows], "o-", label="stack")
    itl.set(xlabel="concurrent streams", ylabel="seconds (p99)", title="Until a stream has its whole answer")
    itl.legend()
    figure.suptitle("Fan-out (simulated engine at zero cost)")
    return _save(figure, path)


def batching(report: dict, path: Path) -> Path:
    concurrencies = sorted(report["table"])
    figure, axis = plt.subplots(figsize=(6, 4))
    axis.plot(concurrencies, [report["table"][c]["output_tokens_per_s"] for c in concurrencies], "o-")
    axis.set(
        xlabel="concurrent requests",
        ylabel="output tokens/s",
        title="vLLM continuous batching through the stack",
    )
    axis.set_xticks(concurrencies)
    return _save(figure, path)


def idle(report: dict, path: Path) -> Path:
    figure, axis = plt.subplots(figsize=(6, 4))
    axis.hist([s * 1000 for s in report["lateness_samples"]], bins=40)
    axis.set(
        xlabel="heartbeat lateness (ms)",
        ylabel="heartbeats",
        title=f"{report['streams']} idle streams: heartbeat lateness",
    )
    return _save(figure, path)


def scheduling(report: dict, path: Path) -> Path:
    figure, (cdf, depth) = plt.subplots(1, 2, figsize=(11, 4))
    for mode, style in (("policy", "-"), ("fifo", "--")):
        for tier in ("vip", "normal"):
            samples = report[mode]["ttft_samples"][tier]
            if samples:
                cdf.plot(
                    samples,
                    [(i + 1) / len(samples) for i in range(len(samples))],
                    style,
                    label=f"{mode} {tier}",
                )
        times = [t for t, _ in report[mode]["queue_depth"]]
        depth.plot(times, [d["vip"] + d["normal"] for _, d in report[mode]["queue_depth"]], style, label=mode)
    cdf.set(xscale="log", xlabel="TTFT (s)", ylabel="fraction of answered requests", title="TTFT by tier")
    cdf.legend()
    depth.set(xlabel="time (s)", ylabel="queued requests", title="Queue depth over time")
    depth.legend()
    figure.suptitle(
        f"{report['offered_rate_per_s'] / report['engine_capacity_per_s']:.1f}x the engine's capacity"
    )
    return _save(figure, path)
