import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.conf import settings
from django.db import connection

from accounts.models import User
from chat.models import Conversation, Message
from chat.services import (
    ConversationBusy,
    _unfinished_answers,
    conversation_id_offer,
    conversation_new,
    message_post,
)
from knowledge import services as knowledge_services
from knowledge.prompts import DECLINES
from scheduler import keys
from scheduler.admission import AdmissionRefused
from scheduler.redis import sync_redis
from tests import worker_double
from tests.generation_jobs import MODEL

# Committed transactions: each poster is a thread with its own database connection.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("tier_policies", "variants")]

on_postgresql = pytest.mark.skipif(
    settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql",
    # SQLite's immediate transactions serialize posts already; and the suite's in-memory SQLite
    # fails concurrent writers at once where a database file (as `make run` uses) lets them wait.
    reason="row locks are PostgreSQL's (run with --database postgres)",
)

# Fewer than the connection pool holds: every poster has its connection before they all go.
POSTERS = 8


def _post_all_at_once(own_copy: Callable[[], Conversation], owner: User) -> Counter:
    """POSTERS posts at once, each as a web process would: its own copy of the conversation
    (`own_copy`), on its own connection. Returns how many were accepted, busy or refused."""
    all_at_once = threading.Barrier(POSTERS)

    def post(n: int) -> str:
        try:
            try:
                conversation = own_copy()
            except BaseException:
                all_at_once.abort()  # the others stop waiting; this error is the one reported
                raise
            all_at_once.wait(timeout=120)
            message_post(
                conversation=conversation, text=f"Question {n}", tier="normal", client_id=f"user:{owner.pk}"
            )
            return "accepted"
        except ConversationBusy:
            return "busy"
        except AdmissionRefused as refused:
            return refused.reason
        finally:
            connection.close()

    with ThreadPoolExecutor(POSTERS) as pool:
        futures = [pool.submit(post, n) for n in range(POSTERS)]
    errors = [f.exception() for f in futures if f.exception() is not None]
    # A broken barrier is the echo of another poster's error: report that one.
    errors.sort(key=lambda error: isinstance(error, threading.BrokenBarrierError))
    if errors:
        raise errors[0]
    return Counter(f.result() for f in futures)


@on_postgresql
def test_concurrent_posts_to_one_conversation_accept_one_and_refuse_the_rest_as_busy():
    alice = User.objects.create_user("alice", password="pw")
    conversation = Conversation.objects.create(owner=alice)

    outcomes = _post_all_at_once(lambda: Conversation.objects.get(pk=conversation.pk), alice)

    assert outcomes == {"accepted": 1, "busy": POSTERS - 1}
    assert conversation.messages.filter(role=Message.Role.USER).count() == 1
    assert _unfinished_answers(conversation).count() == 1
    assert sum(sync_redis().xlen(keys.queue(MODEL, tier)) for tier in keys.TIERS) == 1


@on_postgresql
def test_concurrent_first_messages_to_one_offered_conversation_accept_one_and_refuse_the_rest_as_busy():
    alice = User.objects.create_user("alice", password="pw")
    conversation_id = conversation_id_offer()

    # An unsaved conversation of each poster's own for the offered id.
    outcomes = _post_all_at_once(
        lambda: conversation_new(conversation_id=conversation_id, owner=alice, session_key=""), alice
    )

    assert outcomes == {"accepted": 1, "busy": POSTERS - 1}
    conversation = Conversation.objects.get(pk=conversation_id)
    assert conversation.messages.filter(role=Message.Role.USER).count() == 1
    assert sum(sync_redis().xlen(keys.queue(MODEL, tier)) for tier in keys.TIERS) == 1


def _first_message(text: str) -> Message:
    """Post `text` as the first message of a new conversation, with a help center that has
    something on returns and nothing else; the assistant's message."""
    knowledge_services.article_create(
        slug="returns-policy", title="Returns policy", body="You can return most items within 30 days."
    )
    alice = User.objects.create_user("alice", password="pw")
    conversation = Conversation.objects.create(owner=alice)
    posted = message_post(conversation=conversation, text=text, tier="normal", client_id=f"user:{alice.pk}")
    return posted.assistant_message


@pytest.mark.parametrize(
    "greeting", ["Hi", "Hello!", "Bonjour", "Good morning, how are you?", "Hola, ¿qué tal?"]
)
def test_a_first_message_that_only_greets_is_answered_by_the_model_told_to_greet_back(greeting):
    answer = _first_message(greeting)
    (job,) = worker_double.queued("normal")
    assert job["request_id"] == str(answer.generation_id)
    assert "If it is a greeting or thanks, reply briefly." in job["messages"][0]["content"]
    assert answer.generation.status == "pending"  # not the reply that we know nothing about it
    # Its next turn will prefer the worker that answers this one (the conversation is its cache).
    assert job["conversation_id"] == str(answer.conversation_id)


@pytest.mark.parametrize(
    ("question", "language"),
    [
        ("What is the capital of France?", "en"),
        ("Hi, do you have a shop in Paris?", "en"),
        ("Bonjour, avez-vous un magasin à Paris ?", "fr"),
    ],
)
def test_a_first_question_the_help_center_cannot_answer_still_gets_the_honest_reply(question, language):
    answer = _first_message(question)
    assert worker_double.queued("normal") == []
    assert (answer.generation.engine, answer.generation.text) == ("help-center", DECLINES[language])
    assert answer.generation.grounding["declined"]
