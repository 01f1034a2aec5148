"""Thumbs up or down on an answer: one's own finished answers only, kept on the message."""

import pytest
from django.test import Client

from accounts.models import User
from chat.models import Conversation, Message
from tests.chat.conftest import guest_key_of
from tests.generation_jobs import generation_record

pytestmark = pytest.mark.django_db


def _answer(owner: User, status: str = "done") -> Message:
    conversation = Conversation.objects.create(owner=owner)
    return Message.objects.create(
        conversation=conversation,
        role=Message.Role.ASSISTANT,
        generation=generation_record(variant="candidate", status=status),
    )


def _vote(client: Client, message: Message, value: str, **headers):
    return client.post(f"/chat/messages/{message.pk}/feedback", {"value": value}, **headers)


def test_a_vote_is_stored_and_a_second_one_replaces_it(client_alice, alice):
    answer = _answer(alice)
    response = _vote(client_alice, answer, "down", HTTP_ACCEPT="application/json")
    assert response.json() == {"message_id": answer.pk, "feedback": "down"}
    _vote(client_alice, answer, "up")
    answer.refresh_from_db()
    assert answer.feedback == Message.Feedback.UP


def test_htmx_gets_the_buttons_back_with_the_vote_pressed(client_alice, alice):
    answer = _answer(alice)
    html = _vote(client_alice, answer, "up", HTTP_HX_REQUEST="true").content.decode()
    assert 'value="up" class="feedback__button"\n    aria-pressed="true"' in html
    assert 'value="down" class="feedback__button"\n    aria-pressed="false"' in html


def test_without_javascript_the_form_returns_to_the_conversation(client_alice, alice):
    answer = _answer(alice)
    response = _vote(client_alice, answer, "up")
    assert response.status_code == 302
    assert response["Location"] == f"/chat/{answer.conversation_id}"


def test_other_peoples_answers_cannot_be_rated(client_alice):
    bob = User.objects.create_user("bob", password="pw")
    answer = _answer(bob)
    assert _vote(client_alice, answer, "down").status_code == 404
    assert _vote(Client(), answer, "down").status_code == 403  # a guest
    answer.refresh_from_db()
    assert answer.feedback is None


def test_guests_cannot_vote_and_see_no_buttons(guest):
    conversation = Conversation.objects.create(session_key=guest_key_of(guest))
    answer = Message.objects.create(
        conversation=conversation, role=Message.Role.ASSISTANT, generation=generation_record()
    )
    response = _vote(guest, answer, "up", HTTP_ACCEPT="application/json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "sign_in_required"
    answer.refresh_from_db()
    assert answer.feedback is None
    html = guest.get(f"/chat/{conversation.pk}").content.decode()
    assert "Hi" in html
    assert 'class="feedback"' not in html


def test_only_finished_answers_take_a_vote_and_only_up_or_down(client_alice, alice):
    assert _vote(client_alice, _answer(alice, "pending"), "up").status_code == 409
    assert _vote(client_alice, _answer(alice, "error"), "up").status_code == 409
    assert _vote(client_alice, _answer(alice), "meh").status_code == 400


def test_a_vote_without_csrf_token_is_forbidden(alice):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    answer = _answer(alice)
    assert _vote(client, answer, "up").status_code == 403


def test_the_page_shows_the_buttons_on_finished_answers_only(client_alice, alice):
    done = _answer(alice)
    Message.objects.create(
        conversation=done.conversation,
        role=Message.Role.ASSISTANT,
        generation=generation_record(status="pending", text=""),
    )
    html = client_alice.get(f"/chat/{done.conversation_id}").content.decode()
    assert html.count('class="feedback"') == 2
    assert html.count('aria-label="Rate this answer" hidden') == 1
