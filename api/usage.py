"""What each API key used, per day (UTC): requests, errors and tokens, read from the generation
records (scheduler.models.Generation), which every answer finishes once: its API calls' and its
batch jobs' items'. Shown on the console's API keys page and exported in /metrics (api.metrics)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any

from django.db.models import Count, Q, Sum
from django.db.models.functions import Coalesce, TruncDate
from django.utils import timezone

from api.models import BatchJobItem
from scheduler.generation import Origin
from scheduler.models import Generation


@dataclass(frozen=True, slots=True)
class KeyUsage:
    """Requests admitted (finished or not; a call of n choices is one), the answers that ended
    in an error (a call's failed choice cancels the others), and the tokens used."""

    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: KeyUsage) -> KeyUsage:
        return KeyUsage(
            requests=self.requests + other.requests,
            errors=self.errors + other.errors,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
        )


def _key_pk(client_id: str) -> int | None:
    prefix, _, pk = client_id.partition(":")
    return int(pk) if prefix == "key" and pk.isdigit() else None


def key_usage_by_day(*, days: int, today: date | None = None) -> dict[int, dict[date, KeyUsage]]:
    """API key id -> day -> usage, for the `days` days up to today (UTC), days without use left out."""
    today = today or timezone.now().date()
    since = datetime.combine(
        today - timedelta(days=days - 1), time.min, tzinfo=timezone.get_current_timezone()
    )
    usage: dict[int, dict[date, KeyUsage]] = {}
    for key_pk, day, used in (*_api_usage(since), *_batch_usage(since)):
        days_used = usage.setdefault(key_pk, {})
        days_used[day] = days_used.get(day, KeyUsage()) + used
    return usage


def _api_usage(since: datetime) -> Iterator[tuple[int, date, KeyUsage]]:
    rows = (
        Generation.objects.filter(origin=Origin.API, created_at__gte=since)
        .annotate(day=TruncDate("created_at"))
        .values("client_id", "day")
        .annotate(
            # A call of n choices is n generations: its request and prompt count once, as in
            # the response's usage.
            requests=Count("id", filter=Q(choice=0)),
            errors=Count("id", filter=Q(status=Generation.Status.ERROR)),
            prompt_tokens=Coalesce(Sum("prompt_tokens", filter=Q(choice=0)), 0),
            completion_tokens=Coalesce(Sum("completion_tokens"), 0),
        )
    )
    for row in rows:
        key_pk = _key_pk(row["client_id"])
        if key_pk is not None:
            yield key_pk, row["day"], _key_usage(row)


def _batch_usage(since: datetime) -> Iterator[tuple[int, date, KeyUsage]]:
    """The answers of the key's batch jobs (their generations are the owner's batch client's)."""
    rows = (
        BatchJobItem.objects.filter(job__api_key__isnull=False, generation__created_at__gte=since)
        .annotate(day=TruncDate("generation__created_at"))
        .values("job__api_key_id", "day")
        .annotate(
            requests=Count("pk"),
            errors=Count("pk", filter=Q(generation__status=Generation.Status.ERROR)),
            prompt_tokens=Coalesce(Sum("generation__prompt_tokens"), 0),
            completion_tokens=Coalesce(Sum("generation__completion_tokens"), 0),
        )
    )
    for row in rows:
        yield row["job__api_key_id"], row["day"], _key_usage(row)


def _key_usage(row: dict[str, Any]) -> KeyUsage:
    return KeyUsage(
        requests=row["requests"],
        errors=row["errors"],
        prompt_tokens=row["prompt_tokens"],
        completion_tokens=row["completion_tokens"],
    )


def key_usage_today() -> dict[int, KeyUsage]:
    today = timezone.now().date()
    return {
        key_pk: days[today] for key_pk, days in key_usage_by_day(days=1, today=today).items() if today in days
    }
