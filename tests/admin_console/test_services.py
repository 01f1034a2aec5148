"""Console services: audited policy edits, the canary's life cycle and its evaluation, drains."""

import json
import re
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from admin_console.models import AuditLog, CanaryRollout
from admin_console.selectors import canary as canary_selectors
from admin_console.services import canary as canary_services
from admin_console.services import limits as limits_services
from admin_console.services import workers as workers_services
from admin_console.services.audit import EVALUATION_ACTOR_NAME, ConsoleError
from scheduler import keys
from scheduler.generation import Origin
from scheduler.models import CanaryRouting, Generation
from scheduler.policy import tier_policy
from scheduler.redis import sync_redis
from scheduler.routing import canary_split
from scheduler.warmpool import warm_spares
from tests.admin_console.conftest import answers, heartbeat, quality_scored
from tests.generation_jobs import generation_record

pytestmark = pytest.mark.django_db

PLAN = [{"percent": 10, "hold_s": 60}, {"percent": 50, "hold_s": 60}, {"percent": 100, "hold_s": 60}]
RULES = {"min_answers": 10, "min_votes": 5, "window_s": 300}


def _start(staff, steps=PLAN, **rules) -> CanaryRollout:
    return canary_services.canary_start(
        actor=staff, candidate_variant="candidate", steps=steps, rules={**RULES, **rules}
    )


def _hold_elapsed(rollout: CanaryRollout) -> None:
    CanaryRollout.objects.filter(pk=rollout.pk).update(step_started_at=timezone.now() - timedelta(hours=1))


# --- rate limits -------------------------------------------------------------------------------


def test_a_policy_change_applies_to_admission_and_is_audited(staff):
    before = tier_policy("normal")
    limits_services.policy_update(
        actor=staff, tier="normal", changes={"bucket_capacity": 42, "max_queued": 7}
    )
    # Another process's cached copy expires within a second; this one was cleared.
    assert (tier_policy("normal").bucket_capacity, tier_policy("normal").max_queued) == (42, 7)
    entry = AuditLog.objects.get()
    assert (entry.actor, entry.action, entry.target) == (staff, "policy.update", "normal")
    assert entry.changes() == [
        ("bucket_capacity", before.bucket_capacity, 42),
        ("max_queued", before.max_queued, 7),
    ]


def test_an_invalid_policy_is_refused_and_changes_nothing(staff):
    with pytest.raises(ValidationError) as refused:
        limits_services.policy_update(actor=staff, tier="vip", changes={"wait_slo_s": 500, "max_wait_s": 60})
    assert "wait_slo_s" in refused.value.message_dict
    with pytest.raises(ValidationError):
        limits_services.policy_update(actor=staff, tier="vip", changes={"bucket_capacity": 0})
    assert tier_policy("vip").wait_slo_s == 10.0
    assert not AuditLog.objects.exists()


def test_saving_an_unchanged_policy_writes_no_audit_entry(staff):
    limits_services.policy_update(
        actor=staff, tier="vip", changes={"bucket_capacity": tier_policy("vip").bucket_capacity}
    )
    assert not AuditLog.objects.exists()


# --- canary life cycle ----------------------------------------------------------------------------


def test_starting_a_canary_routes_the_first_step_to_the_candidate(staff, live_workers):
    _start(staff)
    split = canary_split()
    assert (split.stable_variant, split.candidate_variant, split.split_percent) == ("stable", "candidate", 10)
    assert split.salt
    entry = AuditLog.objects.get(action="canary.start")
    assert entry.before["split_percent"] == 0
    assert entry.after["steps"] == PLAN


def test_a_canary_needs_a_live_worker_of_the_candidate_and_no_other_canary(staff):
    heartbeat("stable")
    with pytest.raises(ConsoleError, match="'candidate-model', the model of 'candidate'"):
        _start(staff)
    heartbeat("candidate")
    _start(staff)
    with pytest.raises(ConsoleError, match="already running"):
        _start(staff)


def test_a_draining_worker_does_not_count_as_serving_the_candidate(staff):
    heartbeat("candidate", draining=True)
    with pytest.raises(ConsoleError):
        _start(staff)


@pytest.mark.parametrize(
    "steps",
    [[], [{"percent": 50, "hold_s": 1}, {"percent": 20, "hold_s": 1}], [{"percent": 50, "hold_s": 1}]],
)
def test_a_plan_must_rise_to_100(staff, live_workers, steps):
    with pytest.raises(ValidationError):
        _start(staff, steps=steps)
    assert not CanaryRollout.objects.exists()
    assert canary_split().split_percent == 0


def test_a_manual_split_change_restarts_the_hold_and_is_audited(staff, live_workers):
    rollout = _start(staff)
    _hold_elapsed(rollout)
    canary_services.canary_split_set(actor=staff, percent=100)
    assert sync_redis().hget(keys.CANARY, "split_percent") == "100"
    rollout.refresh_from_db()
    assert timezone.now() - rollout.step_started_at < timedelta(seconds=5)
    assert AuditLog.objects.filter(action="canary.split", actor=staff).count() == 1


def test_promotion_makes_the_candidate_stable(staff, live_workers):
    _start(staff)
    quality_scored("stable", 0.5)
    quality_scored("candidate", 0.5)
    rollout = canary_services.canary_promote(actor=staff)
    assert rollout.status == "promoted" and not rollout.automatic
    split = canary_split()
    assert (split.stable_variant, split.candidate_variant, split.split_percent) == ("candidate", "", 0)


def test_a_manual_rollback_sends_everything_to_stable_and_records_the_numbers(staff, live_workers):
    _start(staff)
    answers("candidate", 4, errors=1)
    rollout = canary_services.canary_rollback(actor=staff)
    assert (rollout.status, rollout.rollback_reason, rollout.automatic) == ("rolled_back", "manual", False)
    assert rollout.rollback_numbers["candidate"]["errors"] == 1
    assert (canary_split().candidate_variant, canary_split().split_percent) == ("", 0)
    with pytest.raises(ConsoleError):
        canary_services.canary_rollback(actor=staff)


@pytest.mark.parametrize(
    ("stable_score", "candidate_score", "says"),
    [
        (None, None, "stable and candidate have no quality score yet"),
        (0.5, None, "candidate has no quality score yet"),
        (0.5, 0.49, "candidate's quality score (0.490) is below stable's (0.500)"),
    ],
)
def test_promotion_is_refused_unless_the_candidate_scores_at_least_stable(
    staff, live_workers, stable_score, candidate_score, says
):
    _start(staff)
    for variant, score in (("stable", stable_score), ("candidate", candidate_score)):
        if score is not None:
            quality_scored(variant, score)
    with pytest.raises(ConsoleError, match=re.escape(says)):
        canary_services.canary_promote(actor=staff)
    assert CanaryRollout.objects.get().status == "running"
    assert canary_split().stable_variant == "stable"


def test_the_latest_score_counts(staff, live_workers):
    _start(staff)
    quality_scored("stable", 0.5)
    quality_scored("candidate", 0.7)
    quality_scored("candidate", 0.4)  # a later run of the candidate scored worse
    with pytest.raises(ConsoleError, match="below"):
        canary_services.canary_promote(actor=staff)


# --- evaluation -------------------------------------------------------------------------------------


def test_without_a_canary_the_evaluation_does_nothing():
    assert canary_services.canary_evaluate() == "idle"


def test_a_candidate_failing_more_than_stable_is_rolled_back_with_the_numbers(staff, live_workers):
    rollout = _start(staff, max_error_rate_increase_points=5)
    answers("stable", 20)
    answers("candidate", 10, errors=3)
    assert canary_services.canary_evaluate() == "rolled_back"
    rollout.refresh_from_db()
    assert (rollout.status, rollout.automatic, rollout.rollback_reason) == ("rolled_back", True, "error_rate")
    numbers = rollout.rollback_numbers
    assert (numbers["candidate"]["answers"], numbers["candidate"]["errors"]) == (10, 3)
    assert numbers["candidate"]["error_rate"] == pytest.approx(0.3)
    assert numbers["stable"]["error_rate"] == 0
    assert numbers["split_percent"] == 10
    assert [c["state"] for c in numbers["checks"]] == ["breached", "ok", "waiting"]
    assert canary_split().split_percent == 0
    assert AuditLog.objects.get(action="canary.rollback").actor_name == EVALUATION_ACTOR_NAME


def test_too_few_answers_to_judge_neither_roll_back_nor_advance(staff, live_workers):
    rollout = _start(staff)
    _hold_elapsed(rollout)
    answers("stable", 20)
    answers("candidate", 9, errors=9)
    assert canary_services.canary_evaluate() == "holding"
    assert canary_split().split_percent == 10


def test_a_slow_candidate_is_rolled_back(staff, live_workers):
    _start(staff, max_ttft_p95_ratio=1.5)
    answers("stable", 20, ttft_ms=100)
    answers("candidate", 10, ttft_ms=160)
    assert canary_services.canary_evaluate() == "rolled_back"
    assert CanaryRollout.objects.get().rollback_reason == "ttft_p95"


def test_a_candidate_with_more_thumbs_down_is_rolled_back(staff, live_workers):
    _start(staff, max_thumbs_down_increase_points=10)
    answers("stable", 20, thumbs_down=1, thumbs_up=9)
    answers("candidate", 10, thumbs_down=3, thumbs_up=2)
    assert canary_services.canary_evaluate() == "rolled_back"
    rollout = CanaryRollout.objects.get()
    assert rollout.rollback_reason == "thumbs_down"
    assert rollout.rollback_numbers["candidate"]["thumbs_down_rate"] == pytest.approx(0.6)


def test_a_healthy_candidate_advances_after_each_hold_and_is_promoted_after_the_last(staff, live_workers):
    rollout = _start(staff)
    quality_scored("stable", 0.5)
    quality_scored("candidate", 0.6)
    answers("stable", 20)
    answers("candidate", 10)
    assert canary_services.canary_evaluate() == "holding"  # the first hold has not passed
    outcomes = []
    for _ in range(3):
        _hold_elapsed(rollout)
        outcomes.append((canary_services.canary_evaluate(), canary_split().split_percent))
    assert outcomes == [("advanced", 50), ("advanced", 100), ("promoted", 0)]
    assert canary_split().stable_variant == "candidate"
    assert AuditLog.objects.filter(action="canary.split", actor=None).count() == 2


def test_past_the_last_step_a_candidate_scoring_below_stable_waits_at_its_split(staff, live_workers):
    rollout = _start(staff, steps=[{"percent": 100, "hold_s": 60}])
    answers("stable", 20)
    answers("candidate", 10)
    quality_scored("stable", 0.6)
    quality_scored("candidate", 0.5)
    _hold_elapsed(rollout)
    assert canary_services.canary_evaluate() == "awaiting_quality"
    assert (canary_split().stable_variant, canary_split().split_percent) == ("stable", 100)
    quality_scored("candidate", 0.6)
    assert canary_services.canary_evaluate() == "promoted"
    assert canary_split().stable_variant == "candidate"


def test_at_a_full_split_stable_is_judged_on_its_answers_from_before_the_canary(staff, live_workers):
    answers("stable", 20, ago_s=630)
    rollout = _start(staff, steps=[{"percent": 100, "hold_s": 3600}], window_s=60)
    long_ago = timezone.now() - timedelta(seconds=600)
    CanaryRollout.objects.filter(pk=rollout.pk).update(started_at=long_ago, step_started_at=long_ago)
    answers("candidate", 10, errors=5)
    assert canary_services.canary_evaluate() == "rolled_back"
    rollout.refresh_from_db()
    assert rollout.rollback_numbers["stable"]["answers"] == 20


# --- workers ----------------------------------------------------------------------------------------


def test_a_drain_reaches_the_worker_and_is_audited(staff):
    worker_id = heartbeat("stable")
    pubsub = sync_redis().pubsub()
    pubsub.subscribe(keys.CONTROL_CHANNEL)
    try:
        assert pubsub.get_message(timeout=2)["type"] == "subscribe"
        workers_services.worker_drain(actor=staff, worker_id=worker_id)
        message = pubsub.get_message(timeout=2)
    finally:
        pubsub.close()
    assert json.loads(message["data"]) == {"type": "drain", "worker_id": worker_id}
    assert AuditLog.objects.get().target == worker_id
    with pytest.raises(ConsoleError):
        workers_services.worker_drain(actor=staff, worker_id="gone")


def test_the_routing_row_is_created_on_first_use():
    CanaryRouting.objects.all().delete()
    assert CanaryRouting.load().stable_variant == "stable"


# --- warm pool ------------------------------------------------------------------------------------


def test_the_warm_pool_size_reaches_the_workers_and_is_audited(staff):
    assert warm_spares() == 0
    workers_services.warm_spares_set(actor=staff, spares=2)
    assert warm_spares() == 2
    entry = AuditLog.objects.get()
    assert (entry.actor, entry.action) == (staff, "worker.spares")
    assert entry.changes() == [("spares", 0, 2)]
    workers_services.warm_spares_set(actor=staff, spares=2)  # no change, no entry
    assert AuditLog.objects.count() == 1
    with pytest.raises(ValidationError):
        workers_services.warm_spares_set(actor=staff, spares=99)
    assert warm_spares() == 2


def test_answers_served_from_the_cache_do_not_count_for_the_canary():
    generation_record(variant="candidate", status="error")
    cached = generation_record(variant="candidate", ttft_ms=0.4)
    Generation.objects.filter(pk=cached.pk).update(cache="exact", engine="cache")
    stats = canary_selectors.variant_stats(variant="candidate", since=timezone.now() - timedelta(minutes=5))
    assert (stats.answers, stats.errors, stats.ttft_p95_ms) == (1, 1, None)


def test_the_canary_counts_api_and_batch_answers_but_not_the_quality_score_s_questions():
    for origin in (Origin.CHAT, Origin.API, Origin.BATCH):
        generation_record(variant="candidate", status="error", origin=origin)
    generation_record(variant="candidate", origin=Origin.API)
    generation_record(variant="candidate", status="error", origin=Origin.QUALITY, ttft_ms=9000)
    stats = canary_selectors.variant_stats(variant="candidate", since=timezone.now() - timedelta(minutes=5))
    assert (stats.answers, stats.errors, stats.ttft_p95_ms) == (4, 3, None)
