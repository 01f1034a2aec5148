"""Reads of the model variants page: the variants, and what their chat answers were checked for."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

from django.db.models import QuerySet
from django.utils import timezone

from scheduler.generation import Origin
from scheduler.models import Generation, Variant


@dataclass(frozen=True, slots=True)
class VariantGrounding:
    """What the chat's answers of one variant were checked for over a recent window."""

    answers: int
    declined: int  # the honest decline (the help center does not answer)
    checked: int  # sentences checked (a verified answer's) or quoted (an extractive one's)
    replaced: int  # a verified answer's sentences that failed and were replaced by the help center's
    dropped: int  # ... and left out
    corrected_answers: int  # verified answers with a sentence replaced or left out

    @property
    def declined_share(self) -> float:
        return self.declined / self.answers if self.answers else 0.0


GROUNDING_WINDOW = timedelta(hours=1)


def grounding_by_variant(*, window: timedelta = GROUNDING_WINDOW) -> dict[str, VariantGrounding]:
    """Per variant, the chat answers finished within `window` and what their check found
    (Generation.grounding, scheduler.generation.GroundingReport)."""
    rows = Generation.objects.filter(
        origin=Origin.CHAT, finished_at__gte=timezone.now() - window, grounding__isnull=False
    ).values_list("variant", "grounding")
    totals: dict[str, Counter[str]] = {}
    for variant, report in rows.iterator(chunk_size=2000):
        total = totals.setdefault(variant, Counter())
        total["answers"] += 1
        total["declined"] += bool(report.get("declined"))
        for part in ("checked", "replaced", "dropped"):
            total[part] += int(report.get(part, 0))
        total["corrected_answers"] += bool(report.get("replaced") or report.get("dropped"))
    return {
        variant: VariantGrounding(**{field: total[field] for field in VariantGrounding.__slots__})
        for variant, total in totals.items()
    }


def variants() -> QuerySet[Variant]:
    return Variant.objects.order_by("name")
