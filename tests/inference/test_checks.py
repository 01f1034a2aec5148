"""`manage.py check` on the inference worker's settings."""

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from inference.checks import served_model_check


def _ids() -> set[str]:
    return {message.id for message in run_checks() if message.id.startswith("inference.")}


def test_the_default_settings_pass():
    assert _ids() == set()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"INFERENCE_MAX_NUM_SEQS": 0}, {"inference.E001"}),
        ({"INFERENCE_MAX_NUM_SEQS": 2, "VIP_RESERVED_SLOTS": 2}, {"inference.E002"}),
        ({"VIP_RESERVED_SLOTS": -1}, {"inference.E002"}),
        ({"BATCH_MAX_SLOTS": 0}, {"inference.E003"}),
        ({"INFERENCE_MAX_NUM_SEQS": 6, "VIP_RESERVED_SLOTS": 2, "BATCH_MAX_SLOTS": 4}, {"inference.W001"}),
        ({"WORKER_DRAIN_TIMEOUT_S": 40.0}, {"inference.E004"}),
        ({"WORKER_DRAIN_TIMEOUT_S": 35.0}, {"inference.W002"}),
        ({"INFERENCE_ENGINE": "vlm"}, {"inference.E005"}),
        ({"INFERENCE_DTYPE": "bf16"}, {"inference.E007"}),
        ({"GENERATION_TIMEOUT_S": 0.0}, {"inference.E006"}),
    ],
)
def test_settings_that_do_not_agree_are_reported(overrides, expected):
    with override_settings(**overrides):
        assert _ids() == expected


def test_one_slot_with_the_default_vip_reserve_is_refused_with_what_to_change():
    # Seen in production: the worker started and normal requests waited minutes each.
    with override_settings(INFERENCE_MAX_NUM_SEQS=1), pytest.raises(SystemCheckError) as refused:
        call_command("check")
    text = str(refused.value)
    assert "(inference.E002) VIP_RESERVED_SLOTS = 2 of INFERENCE_MAX_NUM_SEQS = 1 slots" in text
    assert "HINT: Set VIP_RESERVED_SLOTS below INFERENCE_MAX_NUM_SEQS" in text


@pytest.mark.django_db
def test_a_worker_whose_model_no_variant_names_is_warned_about(settings):
    assert served_model_check(databases=["default"]) == []
    settings.INFERENCE_MODEL_NAME = "renamed-model"
    [warning] = served_model_check(databases=["default"])
    assert warning.id == "inference.W003"
    assert "renamed-model" in warning.msg
