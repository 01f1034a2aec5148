"""`python -m bench <scenario>`: run one benchmark, print its figures, write JSON and PNGs.

Scenarios: overhead, fanout, batching, idle, scheduling, soak, console, retrieval, cache,
autoscale, quality, peer, control, post, experiment, fairness, affinity (see docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import resource
import signal
import sys
import time
from pathlib import Path

from launcher.process import interrupt_on

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

OUT = Path(__file__).resolve().parent.parent / "docs" / "bench"


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def _report_write(report: dict, path: Path, *, plot: Path | None = None) -> None:
    """The run's figures as JSON, with the machine they were measured on; say where they went."""
    report["machine"] = machine()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str, ensure_ascii=False))
    print(f"wrote {path}" + (f" and {plot}" if plot is not None else ""), file=sys.stderr)


def _print_soak(report: dict) -> None:
    for kind, row in [("all", report["all"]), *sorted(report["per_kind"].items())]:
        print(
            f"{kind:<12} accepted {row['accepted']:5}  completed {row['completed']:5}  lost {row['lost']}  "
            f"duplicated tokens {row['duplicated_tokens']}  skipped tokens {row['skipped_tokens']}  "
            f"wrong answers {row['wrong_answers']}  cut {row['cut']}  errors {row['errors'] or 0}"
        )
    print(f"unanswered in the result streams: {report['all']['unanswered_in_result_streams']}")
    print(f"refused: {report['refusals'] or 0}; web unreachable: {report['unreachable'] or 0}")
    for process, row in sorted(report["memory"].items()):
        growth = row["second_half_growth_mb"]
        print(
            f"{process:<18} RSS start {row['start_mb']:7.1f} MB  end {row['end_mb']:7.1f} MB  "
            f"peak {row['peak_mb']:7.1f} MB  second half {'' if growth is None else f'{growth:+.1f} MB'}"
        )


def _print_fairness(report: dict) -> None:
    def ttft(phase: dict) -> str:
        d = phase["chat_ttft_s"]
        return f"{d['p50'] or 0:5.2f} / {d['p99'] or 0:5.2f} s"

    def load(phase: dict) -> str:
        running, paused = phase["slots_running_mean"] or 0, phase["answers_paused_mean"] or 0
        return (
            f"slots running {running:4.1f} (paused {paused:.1f})  CPU {phase['cpu_percent_mean'] or 0:3.0f}%"
        )

    def versus(phase: dict, baseline: dict | None, figure: str) -> str:
        return f" ({phase[figure] / baseline[figure] - 1:+.1%} vs FIFO)" if baseline else ""

    for n, run in enumerate(report["runs"], 1):
        alone, fifo = run.get("alone"), run.get("flood_fifo")
        print(f"run {n}:")
        for name, phase in run.items():
            relative = (
                f"  p99 {phase['chat_ttft_s']['p99'] / alone['chat_ttft_s']['p99']:5.2f}x alone's"
                if alone and name != "alone"
                else ""
            )
            print(
                f"  {name:<18} chat TTFT p50/p99 {ttft(phase)}{relative}"
                f"  answer tokens/s {phase['tokens_per_s']:4.0f}{versus(phase, fifo, 'tokens_per_s')}"
                f"  prompt+answer tokens/s {phase['service_tokens_per_s']:5.0f}"
                f"{versus(phase, fifo, 'service_tokens_per_s')}"
                f"  answers: chat {phase['chat_answers']} key {phase['flood_answers']}  {load(phase)}"
            )


def _interval(interval: dict, *, rate: bool = True) -> str:
    if interval["value"] is None:
        return "-"
    scale, unit = (100, "%") if rate else (1, "")
    if interval["low"] is None:
        return f"{interval['value'] * scale:.1f}{unit} (n={interval['n']})"
    low, high = interval["low"] * scale, interval["high"] * scale
    return f"{interval['value'] * scale:.1f}{unit} [{low:.1f}-{high:.1f}] (n={interval['n']})"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def main() -> None:
    # `kill` stops a benchmark as Ctrl-C does: the stacks it started stop with it.
    interrupt_on(signal.SIGTERM, signal.SIGHUP)
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "scenario",
        choices=[
            "overhead",
            "fanout",
            "batching",
            "idle",
            "scheduling",
            "soak",
            "console",
            "retrieval",
            "cache",
            "autoscale",
            "quality",
            "peer",
            "control",
            "post",
            "experiment",
            "fairness",
            "affinity",
        ],
    )
    parser.add_argument(
        "--engine", default="vllm", choices=["vllm", "simulated"], help="overhead, experiment"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="overhead, peer, control: interleaved rounds; fairness: runs"
    )
    parser.add_argument("--conversations", type=int, default=12, help="affinity: conversations per mode")
    parser.add_argument(
        "--help-center",
        action="store_true",
        help="affinity: import the demo help center and ask its questions (prompts with excerpts)",
    )
    parser.add_argument("--pairs", type=int, default=12, help="overhead: one-at-a-time pairs per round")
    parser.add_argument("--input-len", type=int, default=128, help="peer: the random dataset's prompt tokens")
    parser.add_argument("--output-len", type=int, default=64, help="peer: tokens per answer")
    parser.add_argument("--streams", default="200,1000,2000", help="fanout: stream counts")
    parser.add_argument("--idle-streams", type=int, default=2000)
    parser.add_argument(
        "--duration",
        type=float,
        help="seconds of traffic: scheduling (default 60), soak (default 600), fairness (60 a phase)",
    )
    parser.add_argument(
        "--modes",
        default="policy,preempt-at-once,no-preemption,fifo",
        help="scheduling: the modes to run (comma-separated)",
    )
    parser.add_argument(
        "--phases", default="alone,fifo,fair_wait,fair", help="fairness: the phases to run (comma-separated)"
    )
    parser.add_argument(
        "--graces",
        default="0",
        help="fairness: the fair phase's FAIR_SHARE_PREEMPT_AFTER_S values, a phase each (comma-separated)",
    )
    parser.add_argument("--tabs", default="1,10,50", help="console: staff tabs open at once")
    parser.add_argument("--sentences", type=int, default=10_000, help="retrieval: sentences in the index")
    parser.add_argument("--queries", type=int, default=500, help="retrieval, cache: questions timed")
    parser.add_argument("--entries", type=int, default=10_000, help="cache: cached questions")
    parser.add_argument("--askers", type=int, default=1000, help="cache: customers in the hit-rate stream")
    parser.add_argument("--spares", type=int, default=3, help="autoscale: the warm pool's size")
    parser.add_argument(
        "--start-s", type=float, default=30.0, help="autoscale: the simulated engine's start time"
    )
    parser.add_argument("--cancels", type=int, default=500, help="control: cancels timed per run")
    parser.add_argument("--listeners", default="1,4", help="control: worker processes listening")
    parser.add_argument("--posts", type=int, default=150, help="post: sequential posts timed per client")
    parser.add_argument("--profile", action="store_true", help="post: also profile the signed-in posts")
    parser.add_argument(
        "--styles", default="extractive,verified,generated", help="quality: the answer styles to measure"
    )
    parser.add_argument("--runs", type=int, default=3, help="quality: runs of each style")
    parser.add_argument(
        "--arms", default="extractive,generated", help="experiment: the two variants (answer styles) compared"
    )
    parser.add_argument("--customers", type=int, default=600, help="experiment: at most this many customers")
    parser.add_argument("--concurrency", type=int, default=8, help="experiment: customers at once")
    parser.add_argument("--seed", type=int, default=1, help="experiment: the customers' random choices")
    parser.add_argument(
        "--keep-going", action="store_true", help="experiment: all customers, not only until an arm wins"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line for every request otherwise
    if args.scenario == "cache":
        # In this process, like retrieval.
        from bench.answer_cache import answer_cache

        print("== cache ==", flush=True)
        report = answer_cache(entries=args.entries, queries=args.queries, askers=args.askers)
        chat, api = report["miss_lookup_ms"], report["miss_lookup_exact_ms"]
        print(
            f"{report['entries']} cached questions, {report['queries']} misses: "
            f"lookup p50 {chat['p50']:.3f} ms, p99 {chat['p99']:.3f} ms, max {chat['max']:.3f} ms; "
            "by its text alone (API) "
            f"p50 {api['p50']:.2f} ms, p99 {api['p99']:.2f} ms; remembering the question "
            f"p50 {report['miss_remember_ms']['p50']:.2f} ms, p99 {report['miss_remember_ms']['p99']:.2f} ms"
        )
        similarity = report["similarity"]
        for threshold, row in similarity["by_threshold"].items():
            paraphrases = f"{row['paraphrases_hit']}/{similarity['paraphrases']}"
            near_misses = f"{row['near_misses_hit']}/{similarity['near_misses']}"
            print(f"threshold {threshold}: {paraphrases} paraphrases hit, {near_misses} near-misses hit")
        for rate in report["hit_rates"]:
            print(
                f"shared after {rate['share_after']} customer(s): hit rate {rate['hit_rate']:.1%} of "
                f"{rate['askers']} askers ({rate['exact']} exact, {rate['semantic']} semantic, "
                f"{rate['miss']} misses); a hit's lookup p50 {rate['hit_lookup_ms']['p50']:.2f} ms, "
                f"p99 {rate['hit_lookup_ms']['p99']:.2f} ms"
            )
        _report_write(report, args.out / "cache.json")
        return
    if args.scenario == "experiment":
        # Before Django is set up here: the scenario points it at the stack's database.
        from bench.experiment import experiment

        print("== experiment ==", flush=True)
        engine = args.engine
        report = experiment(
            arms=args.arms.split(","),
            engine=engine,
            customers=args.customers,
            concurrency=args.concurrency,
            seed=args.seed,
            keep_going=args.keep_going,
        )
        picked, first = report["picked"], report["first_named"]
        if first is not None:
            print(f"first named {first['better']} at {first['conversations']} conversations")
        if picked is None:
            print(f"no arm picked after {report['customers']} customers")
        else:
            print(
                f"picked {picked['better']} after {picked['conversations']} conversations "
                f"({picked['customers']} customers), the verdict held at the next reads"
            )
        for arm in report["final"]["arms"]:
            print(
                f"{arm['label']:<16} conversations {arm['conversations']:4}  decided {arm['decided']:4}  "
                f"resolved by the assistant {_interval(arm['resolved_by_assistant'])}  thumbs-down "
                f"{_interval(arm['thumbs_down_rate'])}  hand-off {_interval(arm['handoff_rate'])}  "
                f"rating {_interval(arm['rating'], rate=False)}  first human reply p50/p90 "
                f"{_seconds(arm['first_reply_p50_s'])}/{_seconds(arm['first_reply_p90_s'])}  resolution "
                f"p50/p90 {_seconds(arm['resolution_p50_s'])}/{_seconds(arm['resolution_p90_s'])}"
            )
        resolved = report["agent"].get("resolved", 0)
        print(f"customers: {report['customer_outcomes']}; the agent resolved {resolved}")
        _report_write(report, args.out / f"experiment-{engine}.json")
        return
    if args.scenario == "control":
        # Before Django is set up here: the scenario points it at a Redis of its own.
        from bench.control import control

        print("== control ==", flush=True)
        report = control(
            cancels=args.cancels, listeners=[int(n) for n in args.listeners.split(",")], rounds=args.rounds
        )
        _report_write(report, args.out / "control.json")
        return
    if args.scenario == "post":
        # In this process: the web's own cost of a post, with no stack around it.
        from bench.post import post, profile_summary

        print("== post ==", flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        profile = args.out / "post.prof" if args.profile else None
        report = post(posts=args.posts, profile_to=profile)
        for kind in ("guest", "signed_in"):
            row = report[kind]
            print(
                f"{kind:<9} {report['posts']} posts: p50 {row['post_ms']['p50']:.2f} ms, "
                f"p99 {row['post_ms']['p99']:.2f} ms; SQL statements {row['sql_statements']['mean']:.1f}, "
                f"Redis round trips {row['redis_round_trips']['mean']:.1f} per post"
            )
        if profile is not None:
            profile_summary(profile)
        _report_write(report, args.out / "post.json")
        return
    if args.scenario == "retrieval":
        # In this process, with no stack to start and nothing to plot.
        from bench.retrieval import retrieval

        print("== retrieval ==", flush=True)
        report = retrieval(sentences=args.sentences, queries=args.queries)
        latency = report["latency_ms"]
        print(
            f"{report['sentences']} sentences ({report['real_sentences']} from the demo help center), "
            f"{report['queries']} questions: p50 {latency['p50']:.2f} ms, p99 {latency['p99']:.2f} ms, "
            f"max {latency['max']:.2f} ms; index built in {report['index_build_s']:.2f} s"
        )
        _report_write(report, args.out / "retrieval.json")
        return
    if args.scenario == "quality":
        # In this process, with its own engine and database; no stack to start.
        from bench import plots
        from bench.quality import quality

        plots.pyplot()
        print("== quality ==", flush=True)
        report = quality(styles=tuple(args.styles.split(",")), runs=args.runs)
        print(
            f"{report['turns']} turns in {report['conversations']} conversations, {report['runs']} runs each"
        )
        for style, row in report["summary"].items():
            for name, figures in row["sets"].items():
                print(
                    f"{style:<10} {name:<7} right {figures['answered_right']['median']:.3f} "
                    f"declined {figures['declined_right']['median']:.3f} "
                    f"invented {figures['invented']['median']:.3f} "
                    f"language {figures['language']['median']:.3f}"
                )
            tps = row["tokens_per_s"]
            print(
                f"{style:<10} TTFT p50 {row['ttft_ms_p50']['median']:.0f} ms "
                f"({row['ttft_ms_p50']['min']:.0f}-{row['ttft_ms_p50']['max']:.0f}), p90 "
                f"{row['ttft_ms_p90']['median']:.0f} ms, added over generated "
                f"{row.get('added_ttft_ms_p50', 0):+.0f} ms"
                + (f", {tps['median']:.1f} tokens/s" if tps else "")
            )
        args.out.mkdir(parents=True, exist_ok=True)
        png = plots.quality(report, args.out / "quality.png")
        _report_write(report, args.out / "quality.json", plot=png)
        return
    # Imported once the arguments are read: `--help` needs none of what a run needs. The
    # scenarios read Redis key names and series from the scheduler, whose modules load models.
    import django

    django.setup()
    from bench import (
        affinity,
        autoscale,
        batching,
        console,
        fairness,
        fanout,
        idle,
        overhead,
        peer,
        plots,
        scheduling,
        soak,
    )

    plots.pyplot()  # without matplotlib, stop now rather than after the run

    # Thousands of streams need thousands of sockets, here and in the processes we start.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"== {args.scenario} ==", flush=True)
    if args.scenario == "overhead":
        report = overhead.overhead(
            engine=args.engine, rounds=args.rounds, pairs=args.pairs, concurrency=16, max_tokens=64
        )
        name = f"overhead-{args.engine}"
        png = plots.overhead(report, args.out / f"{name}.png")
        one, many = report["one_at_a_time"], report["at_once"]

        def ms(distribution: dict) -> str:
            return f"{(distribution['p50'] or 0) * 1000:.1f} ms"

        print(
            f"c=1  {one['pairs']} pairs: TTFT p50 engine alone {ms(one['engine_alone_ttft_s'])}, through the "
            f"stack {ms(one['stack_ttft_s'])}; added p50 {ms(one['paired_difference_s'])} (within pairs), "
            f"{ms(one['outside_engine_s'])} outside the engine (post {ms(one['post_s'])}, queue "
            f"{ms(one['queue_s'])}); tok/s while writing engine {one['engine_alone_tokens_per_s']:.1f}, "
            f"stack {one['stack_tokens_per_s']:.1f}"
        )
        print(
            f"c={many['concurrency']} TTFT p50 engine {many['engine_alone_ttft_p50_s'] * 1000:.1f} ms, "
            f"stack {many['stack_ttft_p50_s'] * 1000:.1f} ms; tok/s engine "
            f"{many['engine_alone_tokens_per_s']:.1f}, stack {many['stack_tokens_per_s']:.1f} "
            f"({many['throughput_ratio']:.0%})"
        )
    elif args.scenario == "fanout":
        report = fanout.fanout(streams=[int(s) for s in args.streams.split(",")], tokens=50)
        name = "fanout"
        png = plots.fanout(report, args.out / f"{name}.png")
    elif args.scenario == "batching":
        report = batching.batching(concurrencies=[1, 4, 16], max_tokens=64)
        name = "batching"
        png = plots.batching(report, args.out / f"{name}.png")
        for c, row in report["table"].items():
            print(
                f"c={c:<3} {row['output_tokens_per_s']:7.1f} tok/s ({report['speedup'][c]:.1f}x)  TTFT p50 "
                f"{row['ttft_s']['p50']:.2f} s  TPOT p50 {row['tpot_s']['p50'] * 1000:.0f} ms"
            )
    elif args.scenario == "idle":
        report = idle.idle(streams=args.idle_streams, hold_s=40, heartbeat_s=15)
        name = "idle"
        png = plots.idle(report, args.out / f"{name}.png")
        lateness = report["heartbeat_lateness_s"]
        print(
            f"{report['streams']} streams: {report['memory_per_stream_kb']:.1f} KB each; heartbeat "
            f"lateness p50 {lateness['p50']:.3f} s, p99 {lateness['p99']:.3f} s, max "
            f"{report['heartbeat_lateness_max_s']:.3f} s over {report['heartbeats']} heartbeats"
        )
    elif args.scenario == "soak":
        report = soak.soak(duration_s=args.duration or 600.0)
        name = "soak"
        png = plots.soak(report, args.out / f"{name}.png")
        _print_soak(report)
    elif args.scenario == "autoscale":
        report = autoscale.autoscale(start_s=args.start_s, spares=args.spares)
        name = "autoscale"
        png = plots.autoscale(report, args.out / f"{name}.png")
        for mode in ("cold", "warm"):
            run = report[mode]
            ttft = run["ttft_after_step_s"]
            print(
                f"{mode:<5} spares {run['spares']}  wait over SLO until "
                f"{run['wait_over_slo_until_s']:5.1f} s after the step "
                f"(max {run['max_normal_wait_after_step_s']:5.1f} s)  TTFT p99 vip "
                f"{ttft['vip']['p99'] or 0:5.2f} s normal {ttft['normal']['p99'] or 0:5.2f} s  refused "
                f"vip {run['refused_after_step']['vip']}/{run['sent_after_step']['vip']} normal "
                f"{run['refused_after_step']['normal']}/{run['sent_after_step']['normal']}  "
                f"failed {run['failed']}"
            )
    elif args.scenario == "fairness":
        report = fairness.fairness(
            runs=args.rounds,
            window_s=args.duration or 60.0,
            phases=args.phases.split(","),
            graces_s=[float(grace) for grace in args.graces.split(",")],
        )
        name = "fairness"
        png = plots.fairness(report, args.out / f"{name}.png")
        _print_fairness(report)
    elif args.scenario == "affinity":
        report = affinity.affinity(
            runs=args.rounds, conversations=args.conversations, help_center=args.help_center
        )
        name, png = "affinity", None
        for n, run in enumerate(report["runs"], 1):
            for mode, phase in run.items():
                later, every = phase["ttft_later_turns_s"], phase["ttft_all_turns_s"]
                queued = phase["queued_later_turns_s"]
                rate = phase["prefix_cache_hit_rate"]
                print(
                    f"run {n} {mode:<8} turns {phase['turns']:3} (declined {phase['declined_turns']})"
                    f"  TTFT of turns 2+ p50 {later['p50'] or 0:5.2f} s"
                    f" p99 {later['p99'] or 0:5.2f} s  every turn p99 {every['p99'] or 0:5.2f} s"
                    f"  prefix-cache hits {'-' if rate is None else f'{rate:.1%}'}"
                    f"  queued (turns 2+) p50 {queued['p50'] or 0:5.2f} s p99 {queued['p99'] or 0:5.2f} s"
                )
    elif args.scenario == "peer":
        report = peer.peer(
            rounds=args.rounds, concurrencies=[1, 16], input_len=args.input_len, output_len=args.output_len
        )
        name = "peer"
        png = plots.peer(report, args.out / f"{name}.png")
        for dataset, rows in report["table"].items():
            for c, row in rows.items():
                print(
                    f"{dataset:<6} c={c:<3} tok/s product {row['product_tokens_per_s']:7.1f}  vllm serve "
                    f"{row['vllm_serve_tokens_per_s']:7.1f}  ({row['throughput_ratio']:.2f}x)   TTFT to text "
                    f"p50 product {row['product_ttft_to_text_p50_ms']:7.1f} ms  vllm serve "
                    f"{row['vllm_serve_ttft_to_text_p50_ms']:7.1f} ms  ({row['added_ttft_p50_ms']:+.1f} ms)"
                )
    elif args.scenario == "console":
        report = console.console(tabs=[int(n) for n in args.tabs.split(",")], window_s=20.0, refusals=4)
        name = "console"
        png = "no plot (the figures are printed above)"
    else:
        modes = tuple(args.modes.split(","))
        report = scheduling.scheduling(
            duration_s=args.duration or 60.0, overload=2.0, vip_share=0.2, modes=modes
        )
        name = "scheduling"
        png = plots.scheduling(report, args.out / f"{name}.png", modes=modes)
        for mode in modes:
            for tier, row in report[mode]["per_tier"].items():
                print(
                    f"{mode:<13} {tier:<6} sent {row['requests']:4}  429 {row['refused_429']:3}  "
                    f"503 {row['refused_503']:4}  timed out {row['timed_out']:3}  "
                    f"silent drops {row['silent_drops']}  TTFT p50 {row['ttft_s']['p50'] or 0:6.2f} s  "
                    f"p99 {row['ttft_s']['p99'] or 0:6.2f} s  "
                    f"queued p99 {row['queue_s']['p99'] or 0:6.2f} s  "
                    f"answered {row['completed']:4}  {row['output_tokens_per_s']:6.1f} tokens/s"
                )
    _report_write(report, args.out / f"{name}.json", plot=png)


if __name__ == "__main__":
    main()
