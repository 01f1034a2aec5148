"""Which queued jobs the worker takes next, given its free slots (inference.slots).

With a slot free, it claims what each tier's room allows (VIP first, then normal and batch, the
queues' fair share and aging deciding within a band). With every slot busy it looks, every
VIP_PREEMPT_POLL_S, for a VIP job to pause an answer for (after the job's grace, if no slot
turns over meanwhile) and, with fair share, for a source served less than the one holding the
most slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from django.conf import settings

from inference import metrics as worker_metrics
from inference.slots import Answer, HeldVip, Slots
from inference.stopping import RedisGaveUp, RedisRetry, wait_for, wait_for_cancelled
from scheduler.generation import Tier
from scheduler.queues import Job, JobQueue

logger = logging.getLogger(__name__)

# With every slot busy, how often the worker looks for a VIP job to preempt for: the longest a
# VIP job waits before it starts. A non-blocking claim, so a slot that frees is reused at once.
VIP_PREEMPT_POLL_S = 0.05
# How long a claim that found nothing waits for a new job before it looks again: with answers
# under way, a slot that frees meanwhile is filled within this; beside another serving worker,
# a turn left to its conversation's worker is looked at again within this. (Alone and idle, a
# worker blocks 1 s.)
CLAIM_LOOK_AGAIN_S = 0.05


class Claimer:
    def __init__(
        self,
        queue: JobQueue,
        slots: Slots,
        retry: RedisRetry,
        *,
        worker_id: str,
        normal_aging_s: float,
        vip_preempt_after_s: float,
        slot_freed: asyncio.Event,
        stopped: asyncio.Event,
        others_serving: Callable[[], bool],
    ) -> None:
        self.queue = queue
        self.slots = slots
        self.retry = retry
        self.worker_id = worker_id
        self.normal_aging_s = normal_aging_s
        self.vip_preempt_after_s = vip_preempt_after_s
        self.slot_freed = slot_freed  # set when an answer gives its slot back
        self.stopped = stopped  # set when the worker is told to stop
        self.others_serving = others_serving  # whether another worker serves the model too
        self.held_vip: HeldVip | None = None

    async def next_jobs(self) -> list[Job]:
        """One look: the jobs to start now; with none, it has waited a little for a slot."""
        self.slots.resume_paused()
        free = self.slots.free()
        if free > 0:
            return await self._unless_stopped(self._claim(free))
        self.slot_freed.clear()
        jobs = await self._unless_stopped(self._claim_vip_over_victim())
        if not jobs and self.held_vip is None:
            jobs = await self._unless_stopped(self._claim_over_share())
        if not jobs:
            await wait_for(self.slot_freed, self._look_again_s())
        return jobs

    def held_vip_ready(self) -> HeldVip | None:
        """The held VIP job, taken off hold, once a slot turned over for it or its customer
        cancelled it: it takes the slot before a paused answer resumes, and nothing is paused
        for it."""
        held = self.held_vip
        if held is not None and (held.cancelled or self.slots.free() > 0):
            self.held_vip = None
            return held
        return None

    async def held_vip_release(self) -> None:
        """Hand the held VIP job back to its queue (stopping, or turned spare); without Redis it
        is taken over when its lease runs out, no longer renewed."""
        if self.held_vip is not None:
            held, self.held_vip = self.held_vip.job, None
            with contextlib.suppress(RedisGaveUp):
                await self.retry(lambda: self.queue.release(held))

    async def _claim(self, free: int) -> list[Job]:
        room = self.slots.room()
        jobs = await self.queue.claim(total=free, per_tier=room, aging_s=self.normal_aging_s)
        if not jobs and room[Tier.NORMAL] == 0:
            # The free slots are VIP's reserve: a source under its share may still take one.
            jobs = await self._claim_over_share()
        if jobs:
            return jobs
        tiers = [tier for tier, count in room.items() if count > 0]
        if self._affinity_applies():
            # A blocking claim would take a new turn straight off the stream, whichever worker
            # has its conversation: with another worker serving, wake when a job arrives and
            # let the claim choose. A turn left to its worker is looked at again within this.
            await self.queue.wait_for_arrival(tiers, timeout_s=CLAIM_LOOK_AGAIN_S)
            return []
        # A blocking read cannot see a slot free: with answers under way it blocks briefly.
        block_s = CLAIM_LOOK_AGAIN_S if self.slots.active() else 1.0
        return await self.queue.claim_blocking(tiers, timeout_s=block_s)

    def _affinity_applies(self) -> bool:
        """Whether a conversation's turn may be left to another worker (scheduler.queues)."""
        return self.queue.fair_share and settings.AFFINITY_WAIT_S > 0 and self.others_serving()

    def _look_again_s(self) -> float:
        """With every slot busy, how long to wait for one to turn over before looking again:
        until the held VIP job's grace runs out, or the time between looks for a waiting one."""
        if self.held_vip is not None:
            waited_s = self.held_vip.waited_s(asyncio.get_running_loop().time())
            left_s = self.vip_preempt_after_s - waited_s
            if left_s > 0:
                return min(VIP_PREEMPT_POLL_S, left_s)
            return VIP_PREEMPT_POLL_S  # the grace is over, and no answer can be paused yet
        if self.slots.may_preempt() or self.slots.over_share_victim() is not None:
            return VIP_PREEMPT_POLL_S
        return 1.0

    async def _claim_vip_over_victim(self) -> list[Job]:
        """Every slot is busy: claim one waiting VIP job and hold it; once it has waited
        `vip_preempt_after_s` since it was queued with no slot turning over, pause the victim to
        make room. (With every slot busy, a slot turns over every service time / slots on
        average: most VIP jobs get one within the grace, and no answer is paused for them.)"""
        victim = self.slots.preemption_victim()
        if victim is None:
            return []
        now = asyncio.get_running_loop().time()
        if self.held_vip is None:
            claimed = await self.queue.claim(total=1, per_tier={Tier.VIP: 1, Tier.NORMAL: 0, Tier.BATCH: 0})
            if not claimed:
                return []
            self.held_vip = HeldVip(claimed[0], held_at=now)
        if self.held_vip.waited_s(now) < self.vip_preempt_after_s:
            return []
        jobs, self.held_vip = [self.held_vip.job], None
        if self._pause(victim, for_job=jobs[0], why="VIP"):
            worker_metrics.PREEMPTIONS.labels(victim.job.generation.variant, victim.job.tier).inc()
        # A victim that finished or was cancelled meanwhile freed its slot anyway.
        return jobs

    async def _claim_over_share(self) -> list[Job]:
        """Every slot is busy: claim a waiting job of the victim's tier whose source was served
        less than the victim's, and pause the victim for it (it resumes, as a VIP preemption's
        does, when a slot turns over). A source under its share then waits for no long answer
        to end."""
        victim = self.slots.over_share_victim()
        if victim is None:
            return []
        jobs = await self.queue.claim(
            total=1, per_tier={victim.job.tier: 1}, under_share_of=victim.job.share.source
        )
        if jobs and self._pause(victim, for_job=jobs[0], why="fair share"):
            worker_metrics.FAIR_SHARE_PREEMPTIONS.labels(victim.job.generation.variant, victim.job.tier).inc()
        return jobs

    def _pause(self, victim: Answer, *, for_job: Job, why: str) -> bool:
        """Pause the victim unless it ended or was cancelled during the claim (its slot is then
        free anyway)."""
        if not victim.preemptible or victim.cancel_requested:
            return False
        logger.info(
            "worker %s: %s paused for %s (%s)", self.worker_id, victim.job.request_id, for_job.request_id, why
        )
        victim.pause()
        return True

    async def _unless_stopped(self, claim: Coroutine[Any, Any, list[Job]]) -> list[Job]:
        """Claim, unless told to stop first: an unresponsive Redis can hold a call for many
        seconds. A claim cut short may leave jobs claimed; they are taken over after the lease.
        One that ended with its jobs all the same hands them back."""
        claiming = asyncio.ensure_future(claim)
        stopping = asyncio.ensure_future(self.stopped.wait())
        await asyncio.wait({claiming, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not claiming.done():
            claiming.cancel()
            await wait_for_cancelled([claiming], give_up_at=self.retry.give_up_at)
            if claiming.done() and not claiming.cancelled() and claiming.exception() is None:
                for job in claiming.result():
                    with contextlib.suppress(RedisGaveUp):
                        await self.retry(lambda job=job: self.queue.release(job))
            return []
        return claiming.result()
