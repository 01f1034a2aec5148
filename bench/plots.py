"""PNG figures for the benchmark report (matplotlib, drawn without a display).

matplotlib is imported only when a figure is drawn: it comes with the `bench` extra, and
`python -m bench --help` must work without it.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType


def pyplot() -> ModuleType:
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise SystemExit(
            "Drawing the figures needs matplotlib: `make install`, or `.venv/bin/pip install -e '.[dev]'`."
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot().close(figure)
    return path


# Issue 16's target for what the stack adds to one customer's time to first token.
ADDED_TTFT_TARGET_MS = 5


def overhead(report: dict, path: Path) -> Path:
    plt = pyplot()
    one, many = report["one_at_a_time"], report["at_once"]
    figure, (ttft, tps, added) = plt.subplots(1, 3, figsize=(15, 4))
    labels = ["c=1", f"c={many['concurrency']}"]
    x = range(len(labels))
    width = 0.38
    alone = [one["engine_alone_ttft_s"]["p50"] * 1000, many["engine_alone_ttft_p50_s"] * 1000]
    stack = [one["stack_ttft_s"]["p50"] * 1000, many["stack_ttft_p50_s"] * 1000]
    ttft.bar([i - width / 2 for i in x], alone, width, label="engine alone")
    ttft.bar([i + width / 2 for i in x], stack, width, label="through the stack")
    ttft.set(xticks=list(x), xticklabels=labels, ylabel="TTFT p50 (ms)", title="Time to first token")
    ttft.legend()
    alone = [one["engine_alone_tokens_per_s"], many["engine_alone_tokens_per_s"]]
    stack = [one["stack_tokens_per_s"], many["stack_tokens_per_s"]]
    tps.bar([i - width / 2 for i in x], alone, width, label="engine alone")
    tps.bar([i + width / 2 for i in x], stack, width, label="through the stack")
    tps.set(xticks=list(x), xticklabels=labels, ylabel="output tokens/s", title="Throughput")
    # Each request through the stack: its time to first token less its engine call's.
    outside = sorted(seconds * 1000 for seconds in one["outside_engine_each_s"])
    added.hist(outside, bins=30, color="tab:orange")
    target = ADDED_TTFT_TARGET_MS
    added.axvline(target, color="black", linestyle="--", label=f"target {target} ms")
    median = one["outside_engine_s"]["p50"] * 1000
    added.axvline(median, color="tab:red", label=f"p50 {median:.1f} ms")
    added.set(xlabel="ms", ylabel="requests", title="c=1: added outside the engine, per request")
    added.legend()
    figure.suptitle(f"Overhead of the stack ({report['engine']} engine)")
    return _save(figure, path)


def fanout(report: dict, path: Path) -> Path:
    plt = pyplot()
    counts = sorted(report["table"])
    rows = [report["table"][c] for c in counts]
    figure, (tps, itl, whole) = plt.subplots(1, 3, figsize=(15, 4))
    tps.plot(counts, [r["bare"]["tokens_per_s"] for r in rows], "o-", label="bare Django SSE (ceiling)")
    tps.plot(counts, [r["stack"]["tokens_per_s"] for r in rows], "o-", label="through the stack")
    tps.set(xlabel="concurrent streams", ylabel="tokens/s delivered", title="Fan-out throughput")
    tps.legend()
    # Per arrival: tokens that reach the reader together count once, so a relay that catches up
    # in large writes is not flattered by the zero gaps between the tokens of one write.
    bare_itl = [(r["bare"]["itl_s"]["p99"] or 0) * 1000 for r in rows]
    itl.plot(counts, bare_itl, "o-", label="bare")
    itl.plot(counts, [(r["stack"]["itl_s"]["p99"] or 0) * 1000 for r in rows], "o-", label="stack")
    itl.plot(counts, [2 * ms for ms in bare_itl], "k--", linewidth=1, label="target: at most 2x bare")
    itl.set(xlabel="concurrent streams", ylabel="ms (p99)", title="Gap between arrivals of text")
    itl.legend()
    whole.plot(counts, [r["bare"]["last_token_s"]["p99"] for r in rows], "o-", label="bare")
    whole.plot(counts, [r["stack"]["last_token_s"]["p99"] for r in rows], "o-", label="stack")
    whole.set(
        xlabel="concurrent streams", ylabel="seconds (p99)", title="Until a stream has its whole answer"
    )
    whole.legend()
    figure.suptitle("Fan-out (simulated engine at zero cost)")
    return _save(figure, path)


def batching(report: dict, path: Path) -> Path:
    plt = pyplot()
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
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6, 4))
    axis.hist([s * 1000 for s in report["lateness_samples"]], bins=40)
    axis.set(
        xlabel="heartbeat lateness (ms)",
        ylabel="heartbeats",
        title=f"{report['streams']} idle streams: heartbeat lateness",
    )
    return _save(figure, path)


def scheduling(report: dict, path: Path, *, modes: tuple[str, ...]) -> Path:
    plt = pyplot()
    figure, (cdf, depth) = plt.subplots(1, 2, figsize=(11, 4))
    styles = {"policy": "-", "preempt-at-once": "-.", "no-preemption": ":", "fifo": "--"}
    for mode, style in ((mode, styles[mode]) for mode in modes):
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


def soak(report: dict, path: Path) -> Path:
    plt = pyplot()
    figure, (memory, outcomes) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    for process, row in sorted(report["memory"].items()):
        memory.plot([t for t, _ in row["samples"]], [rss for _, rss in row["samples"]], label=process)
    for at, label in report["chaos"]:
        if label.startswith(("SIGKILL", "restarting")):
            memory.axvline(at, color="grey", linewidth=0.6, linestyle=":")
    memory.set(xlabel="time (s); dotted: a fault", ylabel="RSS (MB)", title="Memory of each process")
    memory.legend(fontsize=6, ncol=2)
    kinds = sorted(report["per_kind"])
    rows = [report["per_kind"][kind] for kind in kinds]
    bottoms = [0] * len(kinds)
    for label, values in (
        ("completed", [r["completed"] for r in rows]),
        ("error", [sum(r["errors"].values()) for r in rows]),
        ("cut", [r["cut"] for r in rows]),
        ("lost", [r["lost"] for r in rows]),
    ):
        outcomes.bar(kinds, values, bottom=bottoms, label=label)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    outcomes.set(ylabel="accepted requests", title="How each accepted request ended")
    outcomes.tick_params(axis="x", labelrotation=30)
    outcomes.legend()
    figure.suptitle(f"Chaos soak, {report['duration_s'] / 60:.0f} min (simulated engine, two workers)")
    return _save(figure, path)


def autoscale(report: dict, path: Path) -> Path:
    plt = pyplot()
    figure, (wait, fleet, ttft) = plt.subplots(1, 3, figsize=(15, 4.2))
    step = report["cold"]["step_at_s"]
    for mode, color in (("cold", "tab:blue"), ("warm", "tab:orange")):
        run = report[mode]
        label = "cold start" if mode == "cold" else f"warm pool ({run['spares']} spares)"
        times = [s["t"] for s in run["samples"]]
        wait.plot(times, [s.get("normal_wait_s") for s in run["samples"]], color=color, label=label)
        fleet.plot(
            times, [s.get("desired") for s in run["samples"]], ":", color=color, label=f"{mode}: desired"
        )
        fleet.plot(
            times,
            [s.get("live", 0) - s.get("spare", 0) for s in run["samples"]],
            color=color,
            label=f"{mode}: serving",
        )
        for tier, marker in (("normal", "."), ("vip", "x")):
            points = [r for r in run["requests"] if r["tier"] == tier and r["ttft_s"] is not None]
            ttft.plot(
                [r["t"] for r in points],
                [r["ttft_s"] for r in points],
                marker,
                color=color,
                markersize=3,
                alpha=0.6,
                label=f"{mode} {tier}",
            )
    for axis in (wait, fleet, ttft):
        axis.axvline(step, color="grey", linewidth=0.8)
    wait.axhline(report["normal_wait_slo_s"], color="red", linewidth=0.8, label="normal SLO")
    wait.set(xlabel="time (s)", ylabel="predicted wait (s)", title="Normal tier's queue wait")
    fleet.set(xlabel="time (s)", ylabel="workers", title="Desired vs serving workers")
    ttft.set(xlabel="time sent (s)", ylabel="TTFT (s)", yscale="log", title="TTFT of each request")
    for axis in (wait, fleet, ttft):
        axis.legend(fontsize=7)
    figure.suptitle(
        f"Load step 0.5x -> 3x one worker's capacity at {step:.0f} s; engine start "
        f"{report['simulated_start_s']:.0f} s; KEDA stand-in polls every {report['keda_poll_s']:.0f} s"
    )
    return _save(figure, path)


def quality(report: dict, path: Path) -> Path:
    """Per answer style and question set: answered right, declined right and answers with an
    invented fact (medians of the runs, the spread as error bars); beside them the time to the
    first text shown."""
    plt = pyplot()
    summary = report["summary"]
    styles = list(summary)
    sets = list(next(iter(summary.values()))["sets"])
    parts = [
        ("answered_right", "answered right"),
        ("declined_right", "declined right"),
        ("invented", "invented"),
    ]
    figure, axes = plt.subplots(
        1,
        len(sets) + 1,
        figsize=(5 * len(sets) + 4, 4.5),
        gridspec_kw={"width_ratios": [3] * len(sets) + [2]},
    )
    width = 0.8 / len(styles)
    for axis, name in zip(axes, sets, strict=False):
        for i, style in enumerate(styles):
            figures = [summary[style]["sets"][name][part] for part, _ in parts]
            medians = [f["median"] for f in figures]
            errors = [
                [m - f["min"] for m, f in zip(medians, figures, strict=True)],
                [f["max"] - m for m, f in zip(medians, figures, strict=True)],
            ]
            axis.bar(
                [p + (i - len(styles) / 2 + 0.5) * width for p in range(len(parts))],
                medians,
                width,
                yerr=errors,
                label=style,
            )
        axis.set(
            xticks=list(range(len(parts))),
            xticklabels=[label for _, label in parts],
            ylim=(0, 1),
            ylabel="share of questions",
            title=f"{name} set",
        )
        axis.axhline(0.8, color="grey", linewidth=0.5, linestyle=":")
        axis.legend(fontsize=8)
    ttft = axes[-1]
    medians = [summary[style]["ttft_ms_p50"]["median"] for style in styles]
    ttft.bar(
        styles,
        medians,
        yerr=[
            [m - summary[s]["ttft_ms_p50"]["min"] for m, s in zip(medians, styles, strict=True)],
            [summary[s]["ttft_ms_p50"]["max"] - m for m, s in zip(medians, styles, strict=True)],
        ],
    )
    ttft.set(ylabel="ms", title="Time to first shown text, p50")
    figure.suptitle(
        f"Answer styles on {report['turns']} customer questions ({report['model']}, {report['runs']} runs)"
    )
    return _save(figure, path)


def peer(report: dict, path: Path) -> Path:
    """Output tokens/s and TTFT p50 (to the first text) of the product and of `vllm serve`,
    per dataset and concurrency."""
    plt = pyplot()
    groups = [(dataset, c) for dataset, rows in report["table"].items() for c in rows]
    rows = [report["table"][dataset][c] for dataset, c in groups]
    figure, (tps, ttft) = plt.subplots(1, 2, figsize=(11, 4))
    x = range(len(groups))
    width = 0.38
    labels = [f"{dataset}\nc={c}" for dataset, c in groups]
    for axis, field, ylabel, title in (
        (tps, "tokens_per_s", "output tokens/s", "Output throughput"),
        (ttft, "ttft_to_text_p50_ms", "TTFT p50 (ms)", "Time to first text"),
    ):
        axis.bar(
            [i - width / 2 for i in x],
            [r[f"vllm_serve_{field}"] or 0 for r in rows],
            width,
            label="vllm serve",
        )
        axis.bar(
            [i + width / 2 for i in x], [r[f"product_{field}"] or 0 for r in rows], width, label="product /v1"
        )
        axis.set(xticks=list(x), xticklabels=labels, ylabel=ylabel, title=title)
        axis.legend()
    figure.suptitle(f"vllm bench serve, {report['rounds']} alternating rounds (median)")
    return _save(figure, path)


def fairness(report: dict, path: Path) -> Path:
    """Each source's share of the tokens delivered over time (the chat customers in blues, the
    flooding key in orange) in each flood phase of the first run; beside them the customers'
    TTFT p50 and p99 in every phase of every run."""
    plt = pyplot()
    run = report["runs"][0]
    flooded = [name for name in run if name.startswith("flood_")]
    figure, axes = plt.subplots(1, len(flooded) + 1, figsize=(5.3 * (len(flooded) + 1), 4.5), squeeze=False)
    for axis, mode in zip(axes[0], flooded, strict=False):
        buckets = run[mode]["shares"]
        sources = sorted({s for b in buckets for s in b["shares"]}, key=lambda s: (s == "api key", s))
        times = [b["t"] for b in buckets]
        colors = [
            "tab:orange" if s == "api key" else plt.cm.Blues(0.35 + 0.6 * i / max(len(sources) - 1, 1))
            for i, s in enumerate(sources)
        ]
        axis.stackplot(times, *[[b["shares"].get(s, 0.0) for b in buckets] for s in sources], colors=colors)
        chat = [sum(v for s, v in b["shares"].items() if s != "api key") for b in buckets]
        axis.plot(times, chat, color="black", linewidth=0.8, label="all chat customers")
        axis.set(
            xlabel="time (s)",
            ylabel="share of tokens delivered",
            ylim=(0, 1),
            title=f"{_fairness_label(mode)}: each source's share",
        )
        axis.legend(fontsize=7, loc="upper right")
    ttft = axes[0][-1]
    for q, marker in (("p50", "o"), ("p99", "s")):
        for n, r in enumerate(report["runs"]):
            ttft.plot(
                [_fairness_label(mode) for mode in r],
                [phase["chat_ttft_s"][q] for phase in r.values()],
                marker=marker,
                linestyle="-" if q == "p99" else ":",
                alpha=0.8,
                label=f"{q} run {n + 1}",
            )
    ttft.set(ylabel="chat TTFT (s)", yscale="log", title="Chat customers' time to first token")
    ttft.tick_params(axis="x", labelsize=7, rotation=20)
    ttft.legend(fontsize=7)
    figure.suptitle(
        f"{report['customers']} chat customers beside one API key keeping {report['flood_streams']} "
        f"requests of {report['flood_tokens']} tokens open ({report['slots']} slots, simulated engine)"
    )
    return _save(figure, path)


def _fairness_label(phase: str) -> str:
    """A fairness phase's name on the plot: `flood_fair_0.5s` reads "fair, pausing after 0.5 s"."""
    if phase == "alone":
        return "alone"
    if phase == "flood_fifo":
        return "FIFO"
    if phase == "flood_fair_wait":
        return "fair, waiting"
    return f"fair, pausing after {phase.removeprefix('flood_fair_').removesuffix('s')} s"
