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
from scheduler import keys
from scheduler.admission import AdmissionRefused
from scheduler.redis import sync_redis
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
            conversation = own_copy()
            all_at_once.wait(timeout=30)
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
        return Counter(pool.map(post, range(POSTERS)))


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
