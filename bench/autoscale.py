"""The autoscaling benchmark: a load step from 0.5x to 3x one worker's capacity, with a
stand-in for KEDA that reads `llm_workers_desired` every 15 s and starts workers as KEDA would,
cold (the engine loads first) or beside a warm pool (spares serve as soon as they are needed).

The simulated engine starts in SIMULATED_START_S (30 s, what a vLLM start costs on this
machine's CPU); everything else about a worker start (Python, Django) is real.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import httpx
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from bench.load import SessionPool, one_request
from bench.stack import UNLIMITED, question, running
from bench.stats import RequestResult, distribution
from launcher.process import Process
from launcher.stack import WORKER_STOP_TIMEOUT_S, Stack, worker_command

# One worker: 4 slots, 1 kept for VIP, 40 tokens at 58 ms a step: 2.3 s an answer.
SLOTS, VIP_RESERVED, TOKENS = 4, 1, 40
DECODE_BASE_S, DECODE_PER_SEQ_S = 0.05, 0.002
SERVICE_S = TOKENS * (DECODE_BASE_S + DECODE_PER_SEQ_S * SLOTS)
WORKER_CAPACITY_PER_S = SLOTS / SERVICE_S
NORMAL_WAIT_SLO_S = 10.0
VIP_WAIT_SLO_S = 3.0
KEDA_POLL_S = 15.0  # KEDA's default pollingInterval
MAX_WORKERS = 7  # maxReplicaCount
VIP_SHARE = 0.1


def _gauges(base_url: str) -> dict[str, float]:
    """The scrape KEDA's Prometheus would make: the model's fleet and normal queue."""
    text = httpx.get(f"{base_url}/metrics", timeout=5).text
    wanted = {
        ("llm_workers_desired", ""): "desired",
        ("llm_workers_live", ""): "live",
        ("llm_workers_spare", ""): "spare",
        ("llm_queue_predicted_wait_seconds", "normal"): "normal_wait_s",
        ("llm_queue_depth", "normal"): "normal_queued",
        ("llm_queue_depth", "vip"): "vip_queued",
    }
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") != settings.INFERENCE_MODEL_NAME:
                continue
            name = wanted.get((sample.name, sample.labels.get("tier", "")))
            if name:
                values[name] = sample.value
    return values


class Fleet:
    """The worker processes KEDA would run as pods: started without waiting, never scaled
    down within the run (KEDA's cooldown, 300 s by default, is longer than the run)."""

    def __init__(self, stack: Stack, start_s: float) -> None:
        self.stack = stack
        self.start_s = start_s
        self.started_at: list[float] = []

    def scale_to(self, count: int, *, at: float) -> None:
        while len(self.stack.workers) < min(count, MAX_WORKERS):
            n = len(self.stack.workers)
            self.stack.workers.append(
                Process(
                    "inference",
                    worker_command(),
                    env={**self.stack.env, "SIMULATED_START_S": str(self.start_s)},
                    output=self.stack.workdir / f"worker-{n}.log",
                    stop_timeout_s=WORKER_STOP_TIMEOUT_S,
                )
            )
            self.started_at.append(at)


def _wait_for(condition, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _run(*, spares: int, start_s: float, warm_s: float, step_s: float) -> dict[str, Any]:
    env = {
        **UNLIMITED,
        "INFERENCE_ENGINE": "simulated",
        "INFERENCE_MAX_NUM_SEQS": str(SLOTS),
        "VIP_RESERVED_SLOTS": str(VIP_RESERVED),
        "SIMULATED_OUTPUT_TOKENS": str(TOKENS),
        "GENERATION_MAX_TOKENS": str(TOKENS),
        "SIMULATED_DECODE_BASE_S": str(DECODE_BASE_S),
        "SIMULATED_DECODE_PER_SEQ_S": str(DECODE_PER_SEQ_S),
        "SERVICE_TIME_PRIOR_S": str(SERVICE_S),
        "WAIT_SLO_NORMAL_S": str(NORMAL_WAIT_SLO_S),
        "WAIT_SLO_VIP_S": str(VIP_WAIT_SLO_S),
        "MAX_WAIT_NORMAL_S": "120",
        "MAX_WAIT_VIP_S": "60",
        "GENERATION_TIMEOUT_S": "120",
    }
    with running(env, worker=False) as stack:
        done = stack.manage(
            "shell",
            "-c",
            "from scheduler.models import WarmPool; from scheduler.warmpool import spares_mirror; "
            f"WarmPool.objects.update_or_create(pk=1, defaults={{'spares': {spares}}}); spares_mirror()",
        )
        if done.returncode != 0:
            raise RuntimeError(f"setting the warm pool failed: {done.stderr}")
        fleet = Fleet(stack, start_s)
        # Before the run: the fleet KEDA keeps at 0.5x (one worker, plus the pool), started and up.
        fleet.scale_to(1 + spares, at=0.0)
        print(f"  starting {1 + spares} workers ({start_s:.0f} s engine start)...", flush=True)
        _wait_for(
            lambda: _gauges(stack.base_url).get("live", 0) >= 1 + spares, "the first workers", 120 + start_s
        )
        samples: list[dict[str, float]] = []
        results: list[RequestResult] = []
        stop = threading.Event()
        started = time.perf_counter()

        def watch() -> None:
            """Sample the gauges every second; every KEDA_POLL_S, scale as KEDA would."""
            next_poll = 0.0
            while not stop.is_set():
                now = time.perf_counter() - started
                try:
                    gauges = _gauges(stack.base_url)
                except httpx.HTTPError:
                    gauges = {}
                samples.append({"t": now, **gauges})
                if now >= next_poll and "desired" in gauges:
                    fleet.scale_to(max(1, int(gauges["desired"])) + spares, at=now)
                    next_poll += KEDA_POLL_S
                stop.wait(1.0)

        watcher = threading.Thread(target=watch, name="keda-stand-in")
        watcher.start()

        async def load() -> None:
            pool = SessionPool(stack.base_url)
            await pool.fill("vip", 60)
            await pool.fill("normal", 400)
            rng = random.Random(7)
            tasks: list[asyncio.Task[RequestResult]] = []
            n = 0
            begun = time.perf_counter()
            at = begun
            while at - begun < warm_s + step_s:
                await asyncio.sleep(max(0.0, at - time.perf_counter()))
                tier = "vip" if rng.random() < VIP_SHARE else "normal"
                tasks.append(
                    asyncio.create_task(one_request(pool, tier, question(n), results, timeout_s=150))
                )
                n += 1
                load_x = 0.5 if at - begun < warm_s else 3.0
                at += rng.expovariate(load_x * WORKER_CAPACITY_PER_S)
            await asyncio.gather(*tasks)
            pool.close()

        try:
            asyncio.run(load())
        finally:
            stop.set()
            watcher.join()
    return _summary(results, samples, fleet, started=started, step_at=warm_s, spares=spares)


def _summary(
    results: list[RequestResult],
    samples: list[dict[str, float]],
    fleet: Fleet,
    *,
    started: float,
    step_at: float,
    spares: int,
) -> dict[str, Any]:
    after = [r for r in results if r.submitted_at - started >= step_at]
    over = [s["t"] for s in samples if s["t"] >= step_at and s.get("normal_wait_s", 0) > NORMAL_WAIT_SLO_S]
    requests = [
        {
            "t": round(r.submitted_at - started, 3),
            "tier": r.tier,
            "status": r.status,
            "outcome": r.outcome,
            "ttft_s": None if r.ttft_s is None else round(r.ttft_s, 3),
        }
        for r in results
    ]

    def ttft(tier: str) -> dict[str, float | None]:
        return distribution([r.ttft_s for r in after if r.tier == tier and r.ttft_s is not None])

    return {
        "spares": spares,
        "step_at_s": step_at,
        # The last second after the step with the normal tier's predicted wait over its SLO.
        "wait_over_slo_until_s": round(max(over) - step_at, 1) if over else 0.0,
        "max_normal_wait_after_step_s": max(
            (s.get("normal_wait_s", 0) for s in samples if s["t"] >= step_at), default=0.0
        ),
        "ttft_after_step_s": {"vip": ttft("vip"), "normal": ttft("normal")},
        "refused_after_step": {
            tier: sum(r.status != 202 for r in after if r.tier == tier) for tier in ("vip", "normal")
        },
        "sent_after_step": {tier: sum(r.tier == tier for r in after) for tier in ("vip", "normal")},
        "failed": sum(r.status == 202 and r.outcome != "done" for r in results),
        "workers_started_at_s": fleet.started_at,
        "samples": samples,
        "requests": requests,
    }


def autoscale(*, start_s: float = 30.0, spares: int = 3, warm_s: float = 30.0, step_s: float = 90.0) -> dict:
    """The same step twice: cold starts only, then with `spares` warm spares."""
    report: dict[str, Any] = {
        "worker_capacity_per_s": WORKER_CAPACITY_PER_S,
        "service_s": SERVICE_S,
        "slots": SLOTS,
        "vip_reserved_slots": VIP_RESERVED,
        "normal_wait_slo_s": NORMAL_WAIT_SLO_S,
        "vip_wait_slo_s": VIP_WAIT_SLO_S,
        "keda_poll_s": KEDA_POLL_S,
        "max_workers": MAX_WORKERS,
        "simulated_start_s": start_s,
        "load": {"before": 0.5, "after": 3.0, "vip_share": VIP_SHARE},
    }
    for mode, pool in (("cold", 0), ("warm", spares)):
        print(f"-- {mode} ({pool} warm spares)", flush=True)
        report[mode] = _run(spares=pool, start_s=start_s, warm_s=warm_s, step_s=step_s)
    return report
