"""Writes of the dashboard's workers: draining one, and the warm spares kept per model."""

from __future__ import annotations

from django.db import transaction

from accounts.models import User
from admin_console.models import AuditLog
from admin_console.services.audit import ConsoleError, _audit
from scheduler import control
from scheduler.models import WarmPool
from scheduler.warmpool import spares_mirror
from scheduler.workers import live_workers


def worker_drain(*, actor: User, worker_id: str) -> None:
    """Ask a live worker to stop claiming; its running answers finish, then it exits."""
    worker = next((w for w in live_workers() if w.worker_id == worker_id), None)
    if worker is None:
        raise ConsoleError(f"No live worker {worker_id!r}: it may have stopped already.")
    control.worker_drain(worker_id=worker_id)
    _audit(
        actor=actor,
        action=AuditLog.Action.WORKER_DRAIN,
        target=worker_id,
        before={"model": worker.model, "draining": bool(worker.state.get("draining"))},
        after={"model": worker.model, "draining": True},
    )


def warm_spares_set(*, actor: User, spares: int) -> WarmPool:
    """Keep `spares` warm spare workers per model beyond those it needs (0: no pool)."""
    with transaction.atomic():
        pool = WarmPool.objects.select_for_update().get(pk=WarmPool.load().pk)
        before = {"spares": pool.spares}
        pool.spares = spares
        pool.full_clean()
        if pool.spares == before["spares"]:
            return pool
        pool.save()
        _audit(
            actor=actor,
            action=AuditLog.Action.WARM_SPARES,
            target="warm pool",
            before=before,
            after={"spares": pool.spares},
        )
    spares_mirror()
    return pool
