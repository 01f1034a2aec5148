"""The worker's sequence slots: the answers it holds, and which may start or be paused now.

Decisions only, no I/O: the claim loop (inference.claiming) asks what room each tier has and
which answer to pause, and acts on the answer. VIP may use every free slot; normal and batch
together leave `vip_reserved_slots` free; batch never holds more than `batch_max_slots`. A VIP
job that finds every slot busy pauses the youngest normal (or batch) answer; with fair share, a
source over its even part of the slots loses its youngest answer to a source served less.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

from inference.engines.base import resumable
from scheduler.generation import Queued, Tier
from scheduler.queues import Job

# Which answers a VIP job preempts first: batch, then normal.
_PREEMPT_ORDER = {Tier.BATCH: 0, Tier.NORMAL: 1}


@dataclass(eq=False)
class Answer:
    """A claimed job while this worker holds it, from its claim to its acknowledgement."""

    job: Job
    started_at: float = 0.0  # loop time it first started: the youngest is preempted first
    task: asyncio.Task[None] | None = None
    cancel_requested: bool = False
    # The type of the latest event in its result stream when it was claimed: "queued" for a
    # fresh start (see inference.answering).
    previous_event: str | None = Queued.type
    text: list[str] = field(default_factory=list)
    # True only while the engine is writing it and it may be paused for a VIP job.
    preemptible: bool = False
    # Preempted: holds no slot until the claim loop resumes it (sets `resumed`).
    paused: bool = False
    preempted: bool = False  # its task is being cancelled to pause it, not to end it
    resumed: asyncio.Event = field(default_factory=asyncio.Event)
    # Its outcome is being stored and published: a cancel now comes too late to change it, and
    # a stopping worker waits for it rather than hand back an answer already stored.
    finishing: bool = False

    def pause(self) -> None:
        """Give up its slot: its engine request is cancelled, and it waits to be resumed."""
        self.paused = self.preempted = True
        self.preemptible = False
        assert self.task is not None  # set when it started
        self.task.cancel()


@dataclass(eq=False)
class HeldVip:
    """A VIP job claimed while every slot was busy, waiting out its grace for a slot to turn
    over (see inference.claiming)."""

    job: Job
    held_at: float  # loop time it was claimed
    cancelled: bool = False  # its customer cancelled it meanwhile: it starts at once, and ends

    def waited_s(self, now: float) -> float:
        """Since it was queued by the web's clock, and at least since it was claimed by ours:
        a web host's clock ahead of the worker's cannot stretch the grace."""
        return max(time.time() - self.job.enqueued_at, now - self.held_at)


class Slots:
    """The answers one worker holds, by request id, and its engine's sequence slots."""

    def __init__(
        self,
        capacity: int,
        *,
        vip_reserved: int,
        batch_max: int,
        vip_preemption: bool,
        fair_share_preemption: bool,
    ) -> None:
        self.capacity = capacity
        self.vip_reserved = vip_reserved
        self.batch_max = batch_max
        self.vip_preemption = vip_preemption
        self.fair_share_preemption = fair_share_preemption
        self.answers: dict[str, Answer] = {}

    def active(self) -> list[Answer]:
        """The answers holding a slot: running ones, not the paused."""
        return [a for a in self.answers.values() if not a.paused]

    def free(self) -> int:
        return self.capacity - len(self.active())

    def room(self) -> dict[Tier, int]:
        """How many more jobs of each tier may start now."""
        active = self.active()
        free = self.capacity - len(active)
        not_vip = sum(1 for a in active if a.job.tier != Tier.VIP)
        batch = sum(1 for a in active if a.job.tier == Tier.BATCH)
        normal_room = max(0, min(free, self.capacity - self.vip_reserved - not_vip))
        return {
            Tier.VIP: free,
            Tier.NORMAL: normal_room,
            Tier.BATCH: max(0, min(normal_room, self.batch_max - batch)),
        }

    def preemption_victim(self) -> Answer | None:
        """The answer a VIP job would take the slot of: batch before normal, and within a tier
        the youngest (it has the least to recompute, and one resumed, now old, is not taken
        again before the others). Only answers the engine can resume as they were are paused
        (`resumable`: never a structured output, a seeded sample or a penalised one)."""
        if not self.vip_preemption:
            return None
        candidates = [a for a in self.active() if a.preemptible and _pausable(a)]
        if not candidates:
            return None
        return max(candidates, key=lambda a: (-_PREEMPT_ORDER[a.job.tier], a.started_at))

    def may_preempt(self) -> bool:
        """Whether a VIP job could take a slot now or soon (an answer not yet under way becomes
        preemptible when its first engine request starts)."""
        return self.vip_preemption and any(a.job.tier != Tier.VIP and _pausable(a) for a in self.active())

    def over_share_victim(self) -> Answer | None:
        """The youngest pausable answer of the source holding the most of the slots, when it
        holds more than one and more than an even part (the slots over the sources holding
        them and one newcomer)."""
        if not self.fair_share_preemption:
            return None
        active = self.active()
        held = Counter(a.job.share.source for a in active)
        if not held:
            return None
        source, count = held.most_common(1)[0]
        if count <= 1 or count <= self.capacity / (len(held) + 1):
            return None
        candidates = [
            a
            for a in active
            if a.job.share.source == source and a.job.tier != Tier.VIP and a.preemptible and _pausable(a)
        ]
        return max(candidates, key=lambda a: a.started_at, default=None)

    def resume_paused(self) -> None:
        """Paused answers take their tier's room before any new job of it: they were claimed
        first. The longest paused resumes first."""
        paused = sorted((a for a in self.answers.values() if a.paused), key=lambda a: a.started_at)
        for answer in paused:
            if self.room()[answer.job.tier] > 0:
                answer.paused = False
                answer.resumed.set()


def _pausable(answer: Answer) -> bool:
    return not answer.cancel_requested and resumable(answer.job.generation)
