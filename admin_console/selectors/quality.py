"""Reads of the variants' quality scores, and the gate a candidate passes to become stable."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from admin_console.models import QualityRun
from knowledge.quality import VariantSettings
from scheduler.models import Variant


def quality_run_running(*, variant: str) -> QualityRun | None:
    """The variant's score being run now; one older than QUALITY_RUN_TIMEOUT_S lost its task."""
    since = timezone.now() - timedelta(seconds=settings.QUALITY_RUN_TIMEOUT_S)
    return (
        QualityRun.objects.filter(variant=variant, status=QualityRun.Status.RUNNING, started_at__gte=since)
        .order_by("-started_at", "-id")
        .first()
    )


def quality_latest_by_variant() -> dict[str, QualityRun]:
    """Every variant's latest finished score, by name, in one query."""
    latest: dict[str, QualityRun] = {}
    for run in QualityRun.objects.filter(status=QualityRun.Status.DONE).order_by("-finished_at", "-id"):
        latest.setdefault(run.variant, run)
    return latest


def quality_run_latest(*, variant: str) -> QualityRun | None:
    """The variant's latest finished score."""
    return (
        QualityRun.objects.filter(variant=variant, status=QualityRun.Status.DONE)
        .order_by("-finished_at", "-id")
        .first()
    )


@dataclass(frozen=True, slots=True)
class VariantQuality:
    variant: str
    latest: QualityRun | None  # the latest finished score
    running: QualityRun | None
    last_failed: QualityRun | None  # the latest run, when it failed


def variant_quality(*, variant: str) -> VariantQuality:
    last = QualityRun.objects.filter(variant=variant).order_by("-started_at", "-id").first()
    return VariantQuality(
        variant=variant,
        latest=quality_run_latest(variant=variant),
        running=quality_run_running(variant=variant),
        last_failed=last if last is not None and last.status == QualityRun.Status.FAILED else None,
    )


@dataclass(frozen=True, slots=True)
class QualityGate:
    passed: bool
    reason: str  # why not, in the words the console shows; "" when passed


def _scored_as_it_is(name: str, run: QualityRun) -> bool:
    """Whether the score was asked with the variant's settings as they are now."""
    variant = Variant.objects.filter(name=name).first()
    return variant is not None and run.variant_settings == VariantSettings.of(variant).as_dict()


def quality_gate(*, stable_variant: str, candidate_variant: str) -> QualityGate:
    """A candidate may become stable only when its latest quality score, asked with its
    settings as they are now, is at least stable's (likewise scored)."""
    stable = quality_run_latest(variant=stable_variant)
    candidate = quality_run_latest(variant=candidate_variant)
    missing = [
        name for name, run in ((stable_variant, stable), (candidate_variant, candidate)) if run is None
    ]
    if missing:
        return QualityGate(
            False,
            f"Not promoted: {' and '.join(missing)} {'has' if len(missing) == 1 else 'have'} no quality "
            "score yet. Run it from the canary page first.",
        )
    assert stable is not None and candidate is not None and stable.overall is not None
    assert candidate.overall is not None
    changed = [
        name
        for name, run in ((stable_variant, stable), (candidate_variant, candidate))
        if not _scored_as_it_is(name, run)
    ]
    if changed:
        return QualityGate(
            False,
            f"Not promoted: {' and '.join(changed)} changed since {'its' if len(changed) == 1 else 'their'} "
            "last quality score. Score it again from the canary page first.",
        )
    if candidate.overall < stable.overall:
        return QualityGate(
            False,
            f"Not promoted: {candidate_variant}'s quality score ({candidate.overall:.3f}) is below "
            f"{stable_variant}'s ({stable.overall:.3f}).",
        )
    return QualityGate(True, "")
