"""`manage.py check` on the settings of batch jobs."""

from django.core.checks import run_checks
from django.test import override_settings


def _ids() -> set[str]:
    return {message.id for message in run_checks() if message.id.startswith("api.")}


def test_the_default_settings_pass():
    assert _ids() == set()


def test_a_lease_the_task_cannot_renew_in_time_is_reported():
    with override_settings(BATCH_JOB_LEASE_S=1.5):
        assert _ids() == {"api.E001"}
