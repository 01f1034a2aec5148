"""Reads of the A/B experiments page: the running experiment and the ended ones."""

from __future__ import annotations

from django.db.models import QuerySet

from scheduler.models import Experiment


def experiment_running() -> Experiment | None:
    return Experiment.objects.filter(status=Experiment.Status.RUNNING).first()


def experiments_ended(*, limit: int = 10) -> QuerySet[Experiment]:
    return Experiment.objects.filter(status=Experiment.Status.ENDED)[:limit]
