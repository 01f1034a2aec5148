"""The guest's cookie (chat/guests.py) ends with a sign-in or a sign-out, and what guests said
goes with their conversations."""

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from accounts.models import User
from chat import guests, tasks
from chat.models import Conversation, Message
from knowledge import services as knowledge_services
from scheduler.models import Generation
from tests import worker_double

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("tier_policies", "variants")]

JSON = {"HTTP_ACCEPT": "application/json"}


def _guest_asks(client: Client, text: str) -> tuple[str, str]:
    """(conversation id, request id) of a guest's first message."""
    page = client.get("/").content.decode()
    conversation = re.search(r'action="/chat/([0-9a-f-]{36})/messages"', page).group(1)
    response = client.post(f"/chat/{conversation}/messages", {"text": text}, **JSON)
    assert response.status_code == 202, response.content
    return conversation, response.json()["request_id"]


@pytest.mark.security
def test_the_next_person_on_a_shared_computer_does_not_see_the_guests_conversations():
    User.objects.create_user("alice", password="correct horse battery")
    computer = Client()
    conversation, _ = _guest_asks(computer, "Where is my parcel?")

    signed_in = computer.post("/accounts/login/", {"username": "alice", "password": "correct horse battery"})
    assert signed_in.status_code == 302
    assert signed_in.cookies[guests.COOKIE].value == ""  # ended with the sign-in
    assert computer.post("/accounts/logout/").status_code == 302

    # The next person, as a guest on the same browser, sees nothing of the first guest's.
    assert conversation not in computer.get("/").content.decode()
    assert computer.get(f"/chat/{conversation}").status_code == 404


@pytest.mark.security
def test_signing_out_ends_the_guest_cookie_too():
    computer = Client()
    _guest_asks(computer, "Where is my parcel?")
    computer.force_login(User.objects.create_user("alice", password="pw"))  # signed in elsewhere
    signed_out = computer.post("/accounts/logout/")
    assert signed_out.cookies[guests.COOKIE].value == ""


@pytest.mark.security
def test_the_guest_purge_forgets_the_answers_with_the_conversation(settings):
    knowledge_services.article_create(slug="delivery", title="Delivery", body="Parcels arrive in 3 days.")
    guest = Client(REMOTE_ADDR="198.51.100.1")
    conversation, request_id = _guest_asks(guest, "When does my parcel arrive?")
    worker_double.answer(request_id, "Your parcel to 12 Elm Road arrives Tuesday.")
    Conversation.objects.filter(pk=conversation).update(
        updated_at=timezone.now() - timedelta(days=settings.GUEST_RETENTION_DAYS + 1)
    )

    assert tasks.purge_guest_conversations() >= 1

    assert not Message.objects.filter(conversation_id=conversation).exists()
    record = Generation.objects.get(request_id=request_id)
    assert record.text == ""
    assert record.status == "done"  # its outcome still counts in the figures
