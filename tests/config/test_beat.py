"""config/beat.py: beats on several hosts send each periodic task once a period, and a send
that fails leaves its period to be served."""

from __future__ import annotations

from pathlib import Path

import redis
from kombu.exceptions import OperationalError

import config.beat
from config.beat import OncePerPeriodScheduler
from config.celery import app


def beat(tmp_path: Path, name: str) -> OncePerPeriodScheduler:
    """A beat as `celery worker --beat` makes it, with its own schedule file."""
    scheduler = OncePerPeriodScheduler(app=app, schedule_filename=str(tmp_path / name), lazy=True)
    scheduler.setup_schedule()
    return scheduler


def test_every_periodic_task_has_a_period(tmp_path):
    scheduler = beat(tmp_path, "beat")
    assert "canary-evaluate" in scheduler.schedule
    for entry in scheduler.schedule.values():
        assert entry.schedule.run_every.total_seconds() > 0, entry.name


def test_the_first_beat_to_find_a_task_due_sends_it_and_the_others_wait_a_period(tmp_path, settings):
    first, second = beat(tmp_path, "first"), beat(tmp_path, "second")
    task = first.schedule["canary-evaluate"]
    due, look_again_s = first.is_due(task)
    assert due and look_again_s <= 1.0
    due, look_again_s = second.is_due(second.schedule["canary-evaluate"])
    assert not due
    assert settings.CANARY_EVALUATION_S - 1 < look_again_s <= settings.CANARY_EVALUATION_S
    assert not first.is_due(task)[0], "sent once a period, by whichever beat"


def test_a_send_that_fails_leaves_the_period_to_be_served(tmp_path, monkeypatch):
    first, second = beat(tmp_path, "first"), beat(tmp_path, "second")
    task = first.schedule["canary-evaluate"]
    assert first.is_due(task)[0]

    def broker_down(*args: object, **kwargs: object) -> None:
        raise OperationalError("the broker is unavailable")

    monkeypatch.setattr(app, "send_task", broker_down)
    first.apply_entry(task)  # logged, as Celery logs a failed send
    assert second.is_due(second.schedule["canary-evaluate"])[0], "the period was lost with the send"


def test_while_redis_is_unavailable_a_beat_tries_again_every_second(tmp_path, monkeypatch):
    def unavailable(source: str):
        def run(**kwargs: object) -> None:
            raise redis.ConnectionError("Redis is restarting")

        return run

    scheduler = beat(tmp_path, "beat")
    monkeypatch.setattr(config.beat, "sync_script", unavailable)
    assert scheduler.is_due(scheduler.schedule["canary-evaluate"]) == (False, 1.0)
