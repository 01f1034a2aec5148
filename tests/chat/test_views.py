import pytest
from django.test import Client, override_settings

from chat.models import Conversation, Message, User
from scheduler import keys
from scheduler.models import TierPolicy
from scheduler.policy import policies_mirror
from scheduler.redis import sync_redis

pytestmark = pytest.mark.django_db

JSON = {"HTTP_ACCEPT": "application/json"}


@pytest.fixture
def alice() -> User:
    return User.objects.create_user("alice", password="pw")


@pytest.fixture
def client_alice(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def conversation(alice) -> Conversation:
    return Conversation.objects.create(owner=alice)


def _queued() -> int:
    return sum(sync_redis().xlen(keys.queue("stable", tier)) for tier in keys.TIERS)


def _post(client: Client, conversation: Conversation, text: str, **extra):
    return client.post(f"/chat/{conversation.pk}/messages", {"text": text}, **JSON, **extra)


def test_a_message_is_stored_queued_and_answered_with_202_and_a_request_id(client_alice, conversation):
    response = _post(client_alice, conversation, "  Where is my order?  ")
    assert response.status_code == 202
    body = response.json()
    assert body["position"] == 1
    assert body["stream_url"] == f"/chat/stream/{body['request_id']}"
    user_message, assistant_message = conversation.messages.all()
    assert (user_message.role, user_message.content) == ("user", "Where is my order?")
    answer = assistant_message.generation
    assert (answer.status, str(answer.request_id)) == ("pending", body["request_id"])
    assert _queued() == 1


@pytest.mark.parametrize("text", ["", "   \n ", "x" * 4001])
def test_empty_or_oversized_messages_get_400_with_a_reason_and_queue_nothing(
    client_alice, conversation, text
):
    response = _post(client_alice, conversation, text)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_message"
    assert response.json()["error"]["message"]
    assert not conversation.messages.exists()
    assert _queued() == 0


def test_a_post_without_csrf_token_is_forbidden(alice, conversation):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert _post(client, conversation, "hello").status_code == 403
    assert _queued() == 0


def test_unknown_and_foreign_conversations_are_not_found(client_alice, conversation):
    bob = User.objects.create_user("bob", password="pw")
    bobs = Conversation.objects.create(owner=bob)
    guests = Conversation.objects.create(session_key="someone-elses-session")
    for other in (bobs, guests):
        assert _post(client_alice, other, "hi").status_code == 404
        assert client_alice.get(f"/chat/{other.pk}").status_code == 404
    assert (
        client_alice.post("/chat/00000000-0000-0000-0000-000000000000/messages", {"text": "x"}).status_code
        == 404
    )


def test_a_second_message_while_an_answer_is_pending_gets_409(client_alice, conversation):
    assert _post(client_alice, conversation, "first").status_code == 202
    response = _post(client_alice, conversation, "second")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "conversation_busy"
    assert conversation.messages.count() == 2


def _flood(client: Client, owner: User, count: int) -> list:
    responses = []
    for _ in range(count):
        conversation = Conversation.objects.create(owner=owner)
        responses.append(_post(client, conversation, "hello"))
    return responses


def test_a_client_with_three_answers_in_progress_gets_429_until_one_finishes(client_alice, alice):
    responses = _flood(client_alice, alice, 4)
    assert [r.status_code for r in responses] == [202, 202, 202, 429]
    assert responses[-1].json()["error"]["code"] == "too_many_in_progress"
    assert int(responses[-1]["Retry-After"]) == 2
    assert Message.objects.count() == 6


def test_a_flood_from_one_client_gets_429_with_the_buckets_refill_time(client_alice, alice):
    TierPolicy.objects.filter(tier="normal").update(max_concurrent_per_user=100)
    policies_mirror()
    responses = _flood(client_alice, alice, 8)
    # The normal tier's bucket holds 6 and refills one token every 5 s.
    assert [r.status_code for r in responses] == [202] * 6 + [429] * 2
    assert int(responses[-1]["Retry-After"]) == 5
    assert responses[-1].json()["error"]["code"] == "rate_limited_user"
    assert Message.objects.count() == 12


def test_redis_unreachable_at_submit_is_503_with_retry_after_and_loses_nothing(client_alice, conversation):
    sync_redis.cache_clear()
    try:
        with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
            response = _post(client_alice, conversation, "is anyone there?")
    finally:
        sync_redis.cache_clear()
    assert response.status_code == 503
    assert int(response["Retry-After"]) >= 1
    assert response.json()["error"]["code"] == "scheduler_unavailable"
    assert not conversation.messages.exists()


def test_cancel_asks_the_workers_to_stop_a_pending_answer(client_alice, conversation):
    request_id = _post(client_alice, conversation, "long question").json()["request_id"]
    response = client_alice.post(f"/chat/requests/{request_id}/cancel")
    assert response.status_code == 202
    assert response.json()["cancelling"] is True
    assert sync_redis().exists(keys.cancel(request_id))


def test_guests_get_a_session_and_a_conversation_of_their_own():
    guest = Client()
    page = guest.get("/")
    assert page.status_code == 200
    conversation = Conversation.objects.get()
    assert conversation.owner is None
    assert conversation.session_key == guest.session.session_key
    assert _post(guest, conversation, "hello").status_code == 202
    # another guest cannot see it
    assert Client().get(f"/chat/{conversation.pk}").status_code == 404
