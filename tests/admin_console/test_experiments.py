"""A/B experiments in the console: started and ended by keeping an arm, both audited, beside
the canary; the page says when there is not enough data yet."""

import pytest

from admin_console.models import AuditLog
from admin_console.services import canary as canary_services
from admin_console.services import experiments as experiments_services
from admin_console.services.audit import ConsoleError
from scheduler.models import CanaryRouting, Experiment
from scheduler.routing import canary_split, experiment_split
from tests.admin_console.conftest import heartbeat

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def both_models_served(live_workers):
    """Stable's and the candidate's models each have a live worker."""


def test_staff_start_an_experiment_which_routes_at_once_and_is_audited(staff, client_staff):
    response = client_staff.post(
        "/console/experiments/start", {"variant_a": "stable", "variant_b": "candidate", "split_percent": 30}
    )
    assert response.status_code == 302
    running = experiment_split(max_age_s=0)
    assert (running.variant_a, running.variant_b, running.split_percent) == ("stable", "candidate", 30)
    entry = AuditLog.objects.get(action="experiment.start")
    assert (entry.actor, entry.after["split_percent"]) == (staff, 30)


def test_a_second_experiment_or_an_unserved_variant_is_refused(staff):
    with pytest.raises(ConsoleError, match="There is no variant"):
        experiments_services.experiment_start(
            actor=staff, variant_a="stable", variant_b="nope", split_percent=50
        )
    experiments_services.experiment_start(
        actor=staff, variant_a="stable", variant_b="candidate", split_percent=50
    )
    with pytest.raises(ConsoleError, match="already running"):
        experiments_services.experiment_start(
            actor=staff, variant_a="candidate", variant_b="stable", split_percent=50
        )


def test_keeping_an_arm_ends_the_experiment_and_makes_it_stable_audited(staff, client_staff):
    experiments_services.experiment_start(
        actor=staff, variant_a="stable", variant_b="candidate", split_percent=50
    )
    client_staff.post("/console/experiments/end", {"keep": "candidate"})
    assert Experiment.objects.get().kept_variant == "candidate"
    assert experiment_split(max_age_s=0) is None
    assert canary_split(max_age_s=0).stable_variant == "candidate"
    entry = AuditLog.objects.get(action="experiment.end")
    assert (entry.before["stable_variant"], entry.after["stable_variant"]) == ("stable", "candidate")


def test_an_arm_that_is_not_stable_cannot_be_kept_while_a_canary_runs(staff):
    heartbeat("candidate")
    experiments_services.experiment_start(
        actor=staff, variant_a="stable", variant_b="candidate", split_percent=50
    )
    canary_services.canary_start(
        actor=staff,
        candidate_variant="candidate",
        steps=[{"percent": 10, "hold_s": 60}, {"percent": 100, "hold_s": 0}],
        rules={},
    )
    with pytest.raises(ConsoleError, match="canary"):
        experiments_services.experiment_end(actor=staff, keep="candidate")
    experiments_services.experiment_end(actor=staff, keep="stable")
    assert CanaryRouting.load().stable_variant == "stable"


def test_the_page_says_not_enough_data_yet_until_the_intervals_mean_something(staff, client_staff):
    experiments_services.experiment_start(
        actor=staff, variant_a="stable", variant_b="candidate", split_percent=50
    )
    page = client_staff.get("/console/experiments").content.decode()
    assert "not enough data yet (n=0)" in page
    assert "Not enough data yet: each arm needs 30 decided conversations." in page
    assert "Keep stable" in page and "Keep candidate" in page
