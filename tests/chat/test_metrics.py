"""The hand-off's figures on /metrics, per variant."""

import pytest

from chat import handoff
from chat.metrics import HANDOFF_COLLECTOR
from chat.models import Handoff
from scheduler.metrics import web_exposition
from tests.chat.test_outcomes import _conversation

pytestmark = pytest.mark.django_db


def test_metrics_show_who_waits_and_each_variants_hand_off_rate_and_resolved_share():
    for _ in range(3):
        _conversation(variant="stable")
    handed = _conversation(variant="stable")
    handoff.handoff_request(conversation=handed, trigger=Handoff.Trigger.BUTTON, tier="normal")
    HANDOFF_COLLECTOR.forget()  # another test's scrape may have computed the window's figures
    text = web_exposition().decode()
    assert "llm_handoff_waiting 1.0" in text
    assert "llm_handoff_agents_online 0.0" in text
    assert 'llm_conversations{variant="stable"} 4.0' in text
    assert 'llm_handoff_rate{variant="stable"} 0.25' in text
    assert 'llm_assistant_resolved_ratio{variant="stable"} 0.75' in text
