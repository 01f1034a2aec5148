"""`manage.py check` on the settings of the chat's streams."""

import pytest
from django.core.checks import run_checks
from django.test import override_settings


def _ids() -> set[str]:
    return {message.id for message in run_checks() if message.id.startswith("chat.")}


def test_the_default_settings_pass():
    assert _ids() == set()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"SSE_HEARTBEAT_S": 45.0}, {"chat.E001"}),
        ({"SSE_HEARTBEAT_S": 0.0}, {"chat.E001"}),
        ({"SSE_STATUS_INTERVAL_S": 0.0}, {"chat.E002"}),
        ({"STREAM_DISCONNECT_GRACE_S": 1.0}, {"chat.W001"}),
    ],
)
def test_settings_that_do_not_agree_are_reported(overrides, expected):
    with override_settings(**overrides):
        assert _ids() == expected


def test_without_a_proxy_a_long_heartbeat_is_allowed():
    with override_settings(PROXY_STREAM_READ_TIMEOUT_S=0.0, SSE_HEARTBEAT_S=900.0):
        assert _ids() == set()
