import re
from datetime import timedelta

import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.db import OperationalError, connection
from django.test import Client, override_settings
from django.utils import timezone

from accounts import addresses
from accounts.models import User
from chat import tasks
from chat.models import Conversation, Message
from knowledge import services as knowledge_services
from knowledge.prompts import DECLINES
from scheduler import keys, routing
from scheduler.metrics import WEB_REGISTRY
from scheduler.models import CanaryRouting, Generation, TierPolicy, Variant
from scheduler.policy import policies_mirror
from scheduler.redis import sync_redis
from tests import worker_double
from tests.chat.conftest import guest_key_of
from tests.generation_jobs import MODEL, generation_record

pytestmark = pytest.mark.django_db

JSON = {"HTTP_ACCEPT": "application/json"}


@pytest.fixture
def conversation(alice) -> Conversation:
    return Conversation.objects.create(owner=alice)


def _queued() -> int:
    return sum(sync_redis().xlen(keys.queue(MODEL, tier)) for tier in keys.TIERS)


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


@pytest.mark.parametrize("text", ["", "   \n ", "x" * 4001, "a NUL \x00 inside"])
def test_empty_oversized_or_nul_messages_get_400_with_a_reason_and_queue_nothing(
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


def test_a_finished_answer_lets_the_next_message_through_and_is_part_of_its_prompt(
    client_alice, conversation
):
    first = _post(client_alice, conversation, "Where is my order?").json()["request_id"]
    worker_double.answer(first, "It ", "shipped.")
    assert _post(client_alice, conversation, "When does it arrive?").status_code == 202
    prompt = worker_double.queued("normal")[-1]["messages"]
    assert [(m["role"], m["content"]) for m in prompt[1:]] == [
        ("user", "Where is my order?"),
        ("assistant", "It shipped."),
        ("user", "When does it arrive?"),
    ]
    page = client_alice.get(f"/chat/{conversation.pk}").content.decode()
    assert "It shipped." in page


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
    # The normal tier's bucket holds 6; one token a minute, so that none refills during the
    # flood however slowly a loaded machine posts it.
    TierPolicy.objects.filter(tier="normal").update(max_concurrent_per_user=100, refill_per_s=1 / 60)
    policies_mirror()
    responses = _flood(client_alice, alice, 8)
    assert [r.status_code for r in responses] == [202] * 6 + [429] * 2
    # Honest: the time until the bucket holds a token again, less what has refilled since.
    assert 45 <= int(responses[-1]["Retry-After"]) <= 60
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


def _form_conversation_id(page) -> str:
    match = re.search(r'action="/chat/([0-9a-f-]{36})/messages"', page.content.decode())
    assert match, "the page has no message form"
    return match.group(1)


def _post_to(client: Client, conversation_id: str, text: str):
    return client.post(f"/chat/{conversation_id}/messages", {"text": text}, **JSON)


@override_settings(GUEST_ADDRESS_BUCKET_FACTOR=1)
@pytest.mark.parametrize(
    ("addresses", "refused"),
    [
        ([f"2001:db8:0:7::{n:x}" for n in range(1, 8)], True),  # one /64
        ([f"2001:db8:0:{n:x}::1" for n in range(1, 8)], False),  # seven /64s
        ([f"192.0.2.{n}" for n in range(1, 8)], False),
    ],
)
def test_guests_share_a_bucket_per_ipv6_64_and_per_ipv4_address(addresses, refused):
    # With factor 1 the address bucket holds what one guest's does: 6 messages; one token a
    # minute, so that none refills while a loaded machine posts the seven.
    TierPolicy.objects.filter(tier="normal").update(refill_per_s=1 / 60)
    policies_mirror()
    statuses = []
    for address in addresses:
        guest = Client(REMOTE_ADDR=address)
        response = _post_to(guest, _form_conversation_id(guest.get("/")), "hello")
        statuses.append(response.status_code)
    assert statuses == [202] * 6 + [429 if refused else 202]
    if refused:
        assert response.json()["error"]["code"] == "rate_limited_address"


def test_x_forwarded_for_without_a_trusted_proxy_is_ignored_with_one_warning(caplog):
    addresses._warn_forwarded_for_ignored.cache_clear()  # once per process: start this test's count
    for n in range(2):
        guest = Client(REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR=f"198.51.100.{n}")
        assert _post_to(guest, _form_conversation_id(guest.get("/")), "hello").status_code == 202
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "TRUSTED_PROXIES" in r.message]
    assert len(warnings) == 1
    assert sync_redis().exists(keys.bucket_address("10.0.0.2"))


@pytest.mark.security
@override_settings(TRUSTED_PROXIES=["127.0.0.0/8"])
def test_x_forwarded_for_from_a_peer_outside_the_trusted_networks_is_ignored_and_counted(caplog):
    addresses._warn_forwarded_for_ignored.cache_clear()
    before = WEB_REGISTRY.get_sample_value("llm_forwarded_for_untrusted_total") or 0
    guest = Client(REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="198.51.100.1")
    assert _post_to(guest, _form_conversation_id(guest.get("/")), "hello").status_code == 202
    assert sync_redis().exists(keys.bucket_address("10.0.0.2"))
    assert not sync_redis().exists(keys.bucket_address("198.51.100.1"))
    assert WEB_REGISTRY.get_sample_value("llm_forwarded_for_untrusted_total") > before
    assert any("TRUSTED_PROXIES" in r.message for r in caplog.records if r.levelname == "WARNING")


def test_cookieless_visits_write_nothing_to_the_database():
    for _ in range(20):
        assert Client().get("/").status_code == 200
    assert not Session.objects.exists()
    assert not Conversation.objects.exists()


def test_a_guests_first_message_makes_their_conversation():
    guest = Client()
    conversation_id = _form_conversation_id(guest.get("/"))
    assert _post_to(guest, conversation_id, "hello").status_code == 202
    conversation = Conversation.objects.get()
    assert str(conversation.pk) == conversation_id
    assert conversation.owner is None
    assert conversation.session_key == guest_key_of(guest)
    assert not Session.objects.exists()  # a guest needs no stored session
    # the page now shows it, and another guest cannot see it
    assert _form_conversation_id(guest.get("/")) == conversation_id
    assert Client().get(f"/chat/{conversation_id}").status_code == 404
    assert _post_to(Client(), conversation_id, "mine now?").status_code == 404


def test_new_chats_are_stored_only_with_their_first_message(client_alice, alice):
    ids = [client_alice.post("/chat/conversations", **JSON).json()["id"] for _ in range(5)]
    assert len(set(ids)) == 5
    assert client_alice.get(f"/chat/{ids[0]}").status_code == 200
    assert not Conversation.objects.exists()
    assert _post_to(client_alice, ids[0], "hello").status_code == 202
    assert list(Conversation.objects.values_list("owner", flat=True)) == [alice.pk]
    assert _post_to(client_alice, ids[0], "hello again").status_code == 409  # the same conversation


def test_a_refused_first_message_leaves_no_conversation(client_alice):
    conversation_id = client_alice.post("/chat/conversations", **JSON).json()["id"]
    sync_redis.cache_clear()
    try:
        with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
            response = _post_to(client_alice, conversation_id, "is anyone there?")
    finally:
        sync_redis.cache_clear()
    assert response.status_code == 503
    assert not Conversation.objects.exists()
    assert not Message.objects.exists()


def test_a_post_the_database_cannot_take_in_time_gets_503_and_leaves_nothing(client_alice):
    """As when a burst keeps SQLite's write lock or every pooled PostgreSQL connection busy past
    the timeout: the database layer raises OperationalError while the message is stored."""
    conversation_id = client_alice.post("/chat/conversations", **JSON).json()["id"]

    def locked(execute, sql, params, many, context):
        if sql.startswith("INSERT") and "chat_message" in sql:
            raise OperationalError("database is locked")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(locked):
        response = _post_to(client_alice, conversation_id, "is anyone there?")
    assert response.status_code == 503
    assert int(response["Retry-After"]) >= 1
    assert response.json()["error"]["message"] == "The service is busy. Please try again in a moment."
    assert not Conversation.objects.exists()
    assert not Message.objects.exists()
    assert _queued() == 0


def test_a_guests_first_messages_sent_at_once_all_land_in_their_conversations():
    guest = Client()
    guest.get("/")
    # Three: the most answers a normal customer may have in progress.
    offered = [guest.post("/chat/conversations", **JSON).json()["id"] for _ in range(3)]
    # As a burst does: every post carries the cookie the page gave, none has been answered yet.
    assert all(_post_to(guest, conversation_id, "hello").status_code == 202 for conversation_id in offered)
    assert set(Conversation.objects.values_list("session_key", flat=True)) == {guest_key_of(guest)}
    for conversation_id in offered:
        assert guest.get(f"/chat/{conversation_id}").status_code == 200


def test_a_guests_key_appears_neither_in_redis_nor_in_the_admin():
    guest = Client()
    assert _post_to(guest, _form_conversation_id(guest.get("/")), "hello").status_code == 202
    session_key = guest_key_of(guest)
    redis = sync_redis()
    for key in redis.scan_iter():
        assert session_key not in key
    jobs = [job for tier in keys.TIERS for job in redis.xrange(keys.queue(MODEL, tier))]
    assert jobs
    assert session_key not in repr(jobs)
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", password="pw"))
    page = admin.get(f"/admin/chat/conversation/{Conversation.objects.get().pk}/change/")
    assert page.status_code == 200
    assert session_key not in page.content.decode()


def test_expired_sessions_are_purged_on_schedule():
    expired, live = SessionStore(), SessionStore()
    expired.set_expiry(timezone.now() - timedelta(seconds=1))
    for session in (expired, live):
        session["seen"] = True
        session.save()
    assert tasks.purge_expired_sessions() == 1
    assert list(Session.objects.values_list("session_key", flat=True)) == [live.session_key]


@override_settings(CHAT_MAX_MESSAGE_CHARS=50)
def test_the_page_offers_the_servers_message_limit(client_alice, conversation):
    page = client_alice.get(f"/chat/{conversation.pk}").content.decode()
    assert 'data-max-chars="50"' in page
    assert "0 / 50" in page
    assert "4000" not in page
    assert _post(client_alice, conversation, "x" * 51).status_code == 400


def test_a_vip_customer_sees_the_vip_badge_and_others_do_not(client_alice, alice):
    assert "badge--vip" not in client_alice.get("/").content.decode()
    alice.tier = "vip"
    alice.save()
    assert "badge--vip" in client_alice.get("/").content.decode()
    assert "badge--vip" not in Client().get("/").content.decode()


def test_the_sidebar_titles_conversations_by_their_first_question(client_alice, alice, conversation):
    conversation.messages.create(role=Message.Role.USER, content="Where is my parcel?")
    conversation.messages.create(role=Message.Role.ASSISTANT, content="On its way.")
    conversation.messages.create(role=Message.Role.USER, content="And the second one?")
    long = Conversation.objects.create(owner=alice)
    long.messages.create(role=Message.Role.USER, content="Can I change the delivery address " + "x" * 200)
    empty = Conversation.objects.create(owner=alice)
    page = client_alice.get(f"/chat/{empty.pk}").content.decode()
    assert "Where is my parcel?" in page
    assert "And the second one?" not in page
    assert "Can I change the delivery address xxxxx…" in page
    assert "New conversation" in page
    assert "This conversation" not in page


def test_the_model_variant_shows_to_staff_only(alice, conversation):
    conversation.messages.create(role=Message.Role.USER, content="Hello")
    answer = generation_record(variant="candidate-7b", text="Hi.")
    Generation.objects.filter(pk=answer.pk).update(engine="simulated")
    conversation.messages.create(role=Message.Role.ASSISTANT, generation=answer)
    customer = Client()
    customer.force_login(alice)
    page = customer.get(f"/chat/{conversation.pk}").content.decode()
    assert "candidate-7b" not in page
    assert "simulated engine" in page

    alice.is_staff = True
    alice.save()
    assert "candidate-7b" in customer.get(f"/chat/{conversation.pk}").content.decode()


def test_an_answer_is_written_from_the_help_center_and_names_its_sources(client_alice, conversation):
    knowledge_services.article_create(
        slug="returns-policy", title="Returns policy", body="You can return most items within 30 days."
    )
    knowledge_services.article_create(slug="gift-cards", title="Gift cards", body="Gift cards never expire.")
    assert _post(client_alice, conversation, "How long do I have to return an item?").status_code == 202
    (job,) = worker_double.queued("normal")
    system, question = job["messages"][0]["content"], job["messages"][-1]["content"]
    assert "Answer only from the excerpts of our help center" in system
    assert "You can return most items within 30 days." in question  # with the question it answers
    assert "Gift cards never expire" not in question
    assert question.endswith("Customer question: How long do I have to return an item?")
    answer = conversation.messages.get(role="assistant")
    assert answer.sources == [{"slug": "returns-policy", "title": "Returns policy"}]
    page = client_alice.get(f"/chat/{conversation.pk}").content.decode()
    assert 'href="/help/returns-policy"' in page


def test_a_first_question_the_help_center_does_not_cover_gets_its_reply_without_the_model(
    client_alice, conversation
):
    knowledge_services.article_create(
        slug="returns-policy", title="Returns policy", body="You can return most items within 30 days."
    )
    response = _post(client_alice, conversation, "Avez-vous un magasin à Paris ?")
    assert response.status_code == 202
    assert worker_double.queued("normal") == []  # no queue, no GPU slot
    answer = conversation.messages.get(role="assistant")
    assert (answer.generation.status, answer.generation.engine) == ("done", "help-center")
    assert answer.generation.text == DECLINES["fr"]  # in the customer's language
    assert answer.sources == []
    events = [
        fields["type"] for _, fields in sync_redis().xrange(keys.result(MODEL, str(answer.generation_id)))
    ]
    assert events == ["start", "token", "done"]  # the stream a worker would have written


def test_a_later_question_the_help_center_does_not_cover_gets_the_decline_too(client_alice, conversation):
    knowledge_services.article_create(
        slug="returns-policy", title="Returns policy", body="You can return most items within 30 days."
    )
    Message.objects.create(conversation=conversation, role=Message.Role.USER, content="Can I return a lamp?")
    assert _post(client_alice, conversation, "And can I pay for it with Afterpay?").status_code == 202
    assert worker_double.queued("normal") == []
    answer = conversation.messages.filter(role="assistant").last()
    assert answer.generation.text == DECLINES["en"]


def test_a_follow_up_is_asked_of_the_model_with_its_conversation(client_alice, conversation):
    knowledge_services.article_create(
        slug="returns-policy", title="Returns policy", body="You can return most items within 30 days."
    )
    Message.objects.create(conversation=conversation, role=Message.Role.USER, content="Can I return a lamp?")
    assert _post(client_alice, conversation, "And what if it came broken?").status_code == 202
    (job,) = worker_double.queued("normal")
    assert {"role": "user", "content": "Can I return a lamp?"} in job["messages"]


def test_a_long_conversation_is_read_from_a_start_that_moves_in_blocks(client_alice, conversation, settings):
    settings.CHAT_HISTORY_MESSAGES = 4
    for n in range(5):
        Message.objects.create(conversation=conversation, role=Message.Role.USER, content=f"Earlier {n}")
    assert _post(client_alice, conversation, "Hello there").status_code == 202
    (job,) = worker_double.queued("normal")
    # Five earlier messages, at most four read: the start moves on by two, not by one.
    read = [message["content"] for message in job["messages"][1:-1]]
    assert read == ["Earlier 2", "Earlier 3", "Earlier 4"]


def test_conversations_routed_to_the_candidate_are_asked_its_way_on_the_same_model(client_alice, alice):
    stable, candidate = Variant.objects.get(name="stable"), Variant.objects.get(name="candidate")
    assert stable.model == candidate.model == MODEL
    assert (stable.system_prompt, stable.temperature) != (candidate.system_prompt, candidate.temperature)
    CanaryRouting.objects.update_or_create(
        pk=1, defaults={"stable_variant": "stable", "candidate_variant": "candidate", "split_percent": 100}
    )
    routing.canary_mirror()
    conversation = Conversation.objects.create(owner=alice)
    assert _post(client_alice, conversation, "Hello there").status_code == 202
    (job,) = worker_double.queued("normal")  # the one queue of the model both variants share
    assert job["messages"][0]["content"].startswith(candidate.system_prompt)
    assert (job["temperature"], job["top_p"], job["max_tokens"]) == (
        candidate.temperature,
        candidate.top_p,
        candidate.max_tokens,
    )
    assert conversation.messages.get(role="assistant").generation.variant == "candidate"


def test_a_variant_without_the_help_center_gets_no_excerpts(client_alice, conversation):
    knowledge_services.article_create(
        slug="returns-policy", title="Returns policy", body="You can return most items within 30 days."
    )
    Variant.objects.filter(name="stable").update(knowledge=False, system_prompt="Reply in one line.")
    assert _post(client_alice, conversation, "How long do I have to return an item?").status_code == 202
    (job,) = worker_double.queued("normal")
    assert job["messages"][0]["content"] == "Reply in one line."
    assert conversation.messages.get(role="assistant").sources == []
