"""How many inference workers each model needs now: the signal Kubernetes scales them on.

Little's law per tier: a tier needs the capacity to take its admitted arrivals as they come
and to clear what is already queued within the tier's wait SLO. A worker finishes its slots
over its measured mean service time jobs a second (the same figure the queues' drain rate
adds up), and only its slots outside the VIP reserve for normal and batch traffic, so the
count must cover all traffic on whole workers and the other tiers on their share of them.
Exported as `llm_workers_desired` (scheduler/metrics.py) and shown on the console.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from django.conf import settings

from scheduler import keys
from scheduler.generation import Tier
from scheduler.policy import tier_policy
from scheduler.queues import arrival_rates
from scheduler.workers import WorkerInfo

# A demand of 2.0000001 workers is two: float noise must not start a pod.
_ROUNDING_SLACK = 1e-6


@dataclass(frozen=True, slots=True)
class TierDemand:
    tier: Tier
    arrivals_per_s: float  # admitted
    queued: int
    wait_slo_s: float

    @property
    def jobs_per_s(self) -> float:
        """The throughput that takes the arrivals and clears the queue within the SLO."""
        return self.arrivals_per_s + self.queued / self.wait_slo_s


@dataclass(frozen=True, slots=True)
class WorkerShape:
    """What one worker of the model can do, from the live workers' heartbeats."""

    slots: float
    vip_reserved_slots: float
    mean_service_s: float


def workers_needed(*, demands: list[TierDemand], shape: WorkerShape, target_utilization: float) -> int:
    """Workers that serve `demands` while busy at most `target_utilization` of the time."""
    every_tier = sum(demand.jobs_per_s for demand in demands)
    below_vip = sum(demand.jobs_per_s for demand in demands if demand.tier != Tier.VIP)
    workers = every_tier * shape.mean_service_s / shape.slots
    shared_slots = shape.slots - shape.vip_reserved_slots
    if below_vip > 0:
        # A worker keeps its VIP reserve free even when no VIP is waiting: headroom for the
        # next VIP, paid for by normal and batch traffic needing more workers.
        workers = max(workers, below_vip * shape.mean_service_s / max(shared_slots, 1e-9))
    return max(0, math.ceil(workers / target_utilization - _ROUNDING_SLACK))


def worker_shape(workers: list[WorkerInfo]) -> WorkerShape:
    """The mean over the model's serving workers; settings' values while none reports."""
    serving = [worker for worker in workers if not worker.state.get("draining")]
    if not serving:
        return WorkerShape(
            slots=settings.INFERENCE_MAX_NUM_SEQS,
            vip_reserved_slots=settings.VIP_RESERVED_SLOTS,
            mean_service_s=settings.SERVICE_TIME_PRIOR_S,
        )
    count = len(serving)
    return WorkerShape(
        slots=sum(worker.slots for worker in serving) / count,
        vip_reserved_slots=sum(
            worker.state.get("vip_reserved_slots", settings.VIP_RESERVED_SLOTS) for worker in serving
        )
        / count,
        mean_service_s=sum(
            worker.state.get("mean_service_s", settings.SERVICE_TIME_PRIOR_S) for worker in serving
        )
        / count,
    )


def workers_desired(*, model: str, workers: list[WorkerInfo], queued: Mapping[str, int]) -> int:
    """The model's worker count for now. `workers` are every live worker (any model) and
    `queued` the model's queue depth per tier, both as the caller already read them."""
    arrivals = arrival_rates(model=model)
    demands = [
        TierDemand(
            tier=tier,
            arrivals_per_s=arrivals[tier],
            queued=queued.get(tier, 0),
            wait_slo_s=tier_policy(tier).wait_slo_s,
        )
        for tier in keys.TIERS
    ]
    return workers_needed(
        demands=demands,
        shape=worker_shape([worker for worker in workers if worker.model == model]),
        target_utilization=settings.AUTOSCALE_TARGET_UTILIZATION,
    )
