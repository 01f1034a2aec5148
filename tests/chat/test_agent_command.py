"""`manage.py agent`: staff become agents (and stop being ones) from the command line."""

import pytest
from django.core.management import CommandError, call_command

from accounts.models import User
from chat.models import AgentProfile

pytestmark = pytest.mark.django_db


def test_staff_become_agents_with_the_name_customers_see_and_stop_being_ones():
    User.objects.create_user("sam", password="pw", is_staff=True)
    call_command("agent", "sam", "--display-name", "Sam", "--capacity", "4")
    assert User.objects.get(username="sam").has_perm("chat.agent")
    assert (AgentProfile.objects.get().display_name, AgentProfile.objects.get().capacity) == ("Sam", 4)
    call_command("agent", "sam", "--revoke")
    assert not User.objects.get(username="sam").has_perm("chat.agent")


def test_a_customer_cannot_be_made_an_agent():
    User.objects.create_user("alice", password="pw")
    with pytest.raises(CommandError, match="not staff"):
        call_command("agent", "alice")
    assert not User.objects.get(username="alice").has_perm("chat.agent")
