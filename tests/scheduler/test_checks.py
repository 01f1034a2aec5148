"""`manage.py check` on the scheduler's settings and on the tier policies in force."""

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from scheduler.models import TierPolicy


def _ids(**kwargs) -> set[str]:
    return {message.id for message in run_checks(**kwargs) if message.id.startswith("scheduler.")}


def test_the_default_settings_pass():
    assert _ids() == set()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"WORKER_HEARTBEAT_S": 5.0, "WORKER_HEARTBEAT_TTL_S": 5.0}, "scheduler.E001"),
        ({"WORKER_HEARTBEAT_S": 2.0, "WORKER_HEARTBEAT_TTL_S": 3.0}, "scheduler.W001"),
        ({"JOB_LEASE_S": 0.2}, "scheduler.E002"),
        ({"JOB_MAX_ATTEMPTS": 0}, "scheduler.E003"),
        ({"NORMAL_AGING_S": 120.0}, "scheduler.W101"),
        ({"GENERATION_TIMEOUT_S": 600.0}, "scheduler.W102"),
        ({"PROXY_READ_TIMEOUT_S": 60.0}, "scheduler.W102"),
        ({"REDIS_SENTINELS": [("10.0.0.1", 26379)], "REDIS_URL": "rediss://:pw@redis/0"}, "scheduler.E006"),
    ],
)
def test_settings_that_do_not_agree_are_reported(overrides, expected):
    with override_settings(**overrides):
        assert _ids() == {expected}


def test_no_proxy_means_no_proxy_timeout_to_respect():
    with override_settings(PROXY_READ_TIMEOUT_S=0.0, GENERATION_TIMEOUT_S=3600.0):
        assert _ids() == set()


def test_a_policy_from_the_environment_that_cannot_work_stops_the_check_with_what_to_change(settings):
    settings.RATE_LIMIT_POLICIES = {
        **settings.RATE_LIMIT_POLICIES,
        "vip": {**settings.RATE_LIMIT_POLICIES["vip"], "wait_slo_s": 60.0, "max_wait_s": 30.0},
    }
    with pytest.raises(SystemCheckError) as refused:
        call_command("check")
    assert "RATE_LIMIT_POLICIES['vip']: (scheduler.E101)" in str(refused.value)
    assert "Set the longest predicted wait admitted (wait_slo_s) at or below the expiry" in str(refused.value)


def test_policies_for_other_tiers_than_the_schedulers_are_refused(settings):
    policies = dict(settings.RATE_LIMIT_POLICIES)
    policies["gold"] = policies.pop("vip")
    settings.RATE_LIMIT_POLICIES = policies
    with pytest.raises(SystemCheckError) as refused:
        call_command("check")
    assert "(scheduler.E005)" in str(refused.value)
    assert "'gold'" in str(refused.value)


@pytest.mark.django_db
def test_a_stored_policy_is_checked_against_todays_settings():
    # Saved when the generation timeout was shorter; the longer one no longer fits the proxy.
    TierPolicy.objects.filter(tier="normal").update(max_wait_s=500.0)
    assert _ids(databases=["default"]) == {"scheduler.W102"}
    [message] = [m for m in run_checks(databases=["default"]) if m.id == "scheduler.W102"]
    assert message.obj == "tier policy 'normal' (console)"
    assert _ids() == set()  # `manage.py check` without --database leaves the database alone


@pytest.mark.security
def test_a_deployment_whose_redis_has_no_password_is_warned_by_the_deploy_check():
    with override_settings(REDIS_LOGIN={}):
        assert "scheduler.W002" in _ids(include_deployment_checks=True)
    with override_settings(REDIS_LOGIN={"username": "chat", "password": "pw"}):
        assert "scheduler.W002" not in _ids(include_deployment_checks=True)
