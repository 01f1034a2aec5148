"""Batch jobs: the API, and the feeding a Celery task does, with a test playing the worker."""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from accounts.models import User
from api import jobs, tasks
from api import keys as api_keys
from api.errors import chat_request_parse
from api.models import ApiKey, BatchJob, BatchJobItem
from config.celery import app
from scheduler import keys
from scheduler.admission import request_submit
from scheduler.generation import Origin
from scheduler.models import TierPolicy
from scheduler.policy import policies_mirror
from scheduler.redis import sync_redis
from tests import worker_double
from tests.generation_jobs import MODEL, generation_job

pytestmark = pytest.mark.django_db


def _request(n: int) -> dict:
    return {"model": "stable", "messages": [{"role": "user", "content": f"Question {n}"}], "max_tokens": 8}


@pytest.fixture
def issued() -> api_keys.IssuedApiKey:
    return api_keys.api_key_create(owner=User.objects.create(username="alice"))


@pytest.fixture
def api_key(issued) -> ApiKey:
    return issued.api_key


def _job(api_key: ApiKey, count: int) -> BatchJob:
    return jobs.job_create(api_key=api_key, requests=[chat_request_parse(_request(n)) for n in range(count)])


def _items(job: BatchJob) -> list[BatchJobItem]:
    return list(job.items.order_by("index"))


def _answer_new(answered: set[str]) -> None:
    """The worker double answers every batch request it has not answered yet."""
    for queued in worker_double.queued("batch"):
        if queued["request_id"] not in answered:
            worker_double.answer(queued["request_id"], "Answer ", "to ", queued["messages"][-1]["content"])
            answered.add(queued["request_id"])


def _tasks_sent(queue: str = "batch-jobs") -> list[tuple[str, str]]:
    """(task name, its arguments as text) of each message waiting in one of Celery's queues."""
    messages = [json.loads(raw) for raw in sync_redis().lrange(queue, 0, -1)]
    return [(m["headers"]["task"], m["headers"]["argsrepr"]) for m in messages]


# --- the API --------------------------------------------------------------------------------


def _post_job(plaintext: str, body: object) -> object:
    return Client().post(
        "/v1/jobs",
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {plaintext}"},
    )


def test_a_job_is_accepted_with_202_and_a_task_is_sent_to_feed_it(issued, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = _post_job(issued.plaintext, {"requests": [_request(n) for n in range(3)]})
    assert response.status_code == 202
    body = response.json()
    assert response["Location"] == f"/v1/jobs/{body['id']}"
    assert (body["object"], body["status"]) == ("job", "queued")
    assert body["progress"] == {
        "total": 3,
        "pending": 3,
        "submitted": 0,
        "completed": 0,
        "failed": 0,
        "cancelled": 0,
    }
    job = BatchJob.objects.get()
    assert [item.request["messages"][0]["content"] for item in _items(job)] == [
        f"Question {n}" for n in range(3)
    ]
    [(task, args)] = _tasks_sent()
    assert task == "api.tasks.job_run" and str(job.pk) in args


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"requests": []}, "requests"),
        ({"requests": [_request(0)] * 3}, "requests"),
        ({}, "requests"),
        ({"requests": [_request(0), _request(1) | {"stream": True}]}, "requests[1].stream"),
        ({"requests": [_request(0) | {"n": 3}]}, "requests[0].n"),
        ({"requests": [{"model": "stable"}]}, "requests[0].messages"),
        ({"requests": [_request(0), _request(1) | {"stop": "\x00"}]}, "requests[1]"),
    ],
)
def test_a_malformed_job_gets_400_naming_the_request_and_nothing_is_stored(issued, settings, body, param):
    settings.BATCH_JOB_MAX_REQUESTS = 2
    response = _post_job(issued.plaintext, body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert not BatchJob.objects.exists()


def test_polling_shows_progress_and_results_only_to_the_owner(issued, api_key):
    job = _job(api_key, 2)
    jobs.job_feed(job_id=job.pk, budget_s=0)
    first = worker_double.queued("batch")[0]["request_id"]
    worker_double.answer(first, "Your ", "order ", "shipped.")
    jobs.job_feed(job_id=job.pk, budget_s=0.2)
    auth = {"Authorization": f"Bearer {issued.plaintext}"}
    body = Client().get(f"/v1/jobs/{job.pk}", headers=auth).json()
    assert body["status"] == "running"
    assert (body["progress"]["completed"], body["progress"]["submitted"]) == (1, 1)
    done, waiting = body["results"]
    assert done["index"] == 0 and done["status"] == "completed" and done["error"] is None
    assert done["response"]["object"] == "chat.completion"
    assert done["response"]["id"] == "chatcmpl-" + uuid.UUID(first).hex
    assert done["response"]["choices"][0]["message"]["content"] == "Your order shipped."
    assert done["response"]["usage"]["completion_tokens"] == 3
    assert waiting == {"index": 1, "status": "submitted", "response": None, "error": None}
    stranger = api_keys.api_key_create(owner=User.objects.create(username="bob")).plaintext
    for url in (f"/v1/jobs/{job.pk}", f"/v1/jobs/{uuid.uuid4()}"):
        response = Client().get(url, headers={"Authorization": f"Bearer {stranger}"})
        assert (response.status_code, response.json()["error"]["code"]) == (404, "job_not_found")
    assert (
        Client()
        .post(f"/v1/jobs/{job.pk}/cancel", headers={"Authorization": f"Bearer {stranger}"})
        .status_code
        == 404
    )


# --- feeding --------------------------------------------------------------------------------


def test_a_job_goes_through_the_batch_tier_a_few_at_a_time_and_every_answer_is_stored(api_key, settings):
    settings.BATCH_JOB_MAX_IN_FLIGHT = 2
    job = _job(api_key, 5)
    answered: set[str] = set()
    most_in_flight = 0
    for _ in range(20):
        more = jobs.job_feed(job_id=job.pk, budget_s=0.1)
        most_in_flight = max(most_in_flight, job.items.filter(status="submitted").count())
        _answer_new(answered)
        if not more:
            break
    job.refresh_from_db()
    assert job.status == "completed" and job.finished_at is not None
    assert most_in_flight == 2
    queued = worker_double.queued("batch")
    assert len(queued) == 5  # each request submitted once
    assert {q["client_id"] for q in queued} == {f"jobs:{api_key.owner_id}"}
    items = _items(job)
    assert [i.generation.text for i in items] == [f"Answer to Question {n}" for n in range(5)]
    assert {(i.status, i.generation.finish_reason, i.generation.completion_tokens) for i in items} == {
        ("completed", "stop", 3)
    }
    assert sorted(str(i.generation_id) for i in items) == sorted(q["request_id"] for q in queued)
    assert jobs.job_progress(job=job)["completed"] == 5


def test_a_job_taken_over_from_a_dead_task_re_follows_its_requests_and_submits_none_twice(api_key):
    job = _job(api_key, 2)
    jobs.job_feed(job_id=job.pk, budget_s=0)
    first, second = (q["request_id"] for q in worker_double.queued("batch"))
    worker_double.publish(first, ("start", {}), *worker_double.tokens("Half "))
    # The task feeding the job dies: its lease stays until it runs out.
    BatchJob.objects.filter(pk=job.pk).update(
        runner="dead", lease_expires_at=timezone.now() + timedelta(seconds=30)
    )
    assert jobs.job_feed(job_id=job.pk, budget_s=0) is False  # held: nobody else may feed it
    assert jobs.job_ids_stalled() == []
    BatchJob.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert jobs.job_ids_stalled() == [job.pk]
    worker_double.end(first, ("token", {"seq": 1, "text": "and half."}), worker_double.done())
    worker_double.answer(second, "Second.")
    assert jobs.job_feed(job_id=job.pk, budget_s=5) is False
    job.refresh_from_db()
    assert job.status == "completed"
    # Followed again from the start of its stream: the text before the takeover is kept.
    assert [i.generation.text for i in _items(job)] == ["Half and half.", "Second."]
    assert len(worker_double.queued("batch")) == 2


def test_a_request_whose_task_died_around_submitting_is_neither_lost_nor_asked_twice(api_key):
    job = _job(api_key, 2)
    lost, sent = _items(job)
    # Both had their id stored; only `sent` reached the scheduler before the task died.
    for item in (lost, sent):
        item.generation_id, item.variant, item.model = uuid.uuid4(), "stable", MODEL
        item.save()
    request_submit(
        job=generation_job(
            str(sent.generation_id), tier="batch", client_id=job.client_id, origin=Origin.BATCH
        )
    )
    jobs.job_feed(job_id=job.pk, budget_s=0)
    queued = [q["request_id"] for q in worker_double.queued("batch")]
    assert sorted(queued) == sorted([str(sent.generation_id), str(lost.generation_id)])
    assert {i.status for i in _items(job)} == {"submitted"}


def test_a_full_batch_queue_holds_submissions_back_without_failing_the_job(api_key):
    TierPolicy.objects.filter(tier="batch").update(max_queued=2)
    policies_mirror()
    job = _job(api_key, 4)
    assert jobs.job_feed(job_id=job.pk, budget_s=0.1) is True
    assert [i.status for i in _items(job)] == ["submitted", "submitted", "pending", "pending"]
    sync_redis().set(keys.claimed_seq(MODEL, "batch"), 2)  # a worker took both
    jobs.job_feed(job_id=job.pk, budget_s=0)
    assert [i.status for i in _items(job)] == ["submitted"] * 4
    assert len(worker_double.queued("batch")) == 4


def test_cancelling_recalls_unanswered_requests_and_keeps_the_answers_already_stored(
    issued, api_key, settings
):
    settings.BATCH_JOB_MAX_IN_FLIGHT = 2
    job = _job(api_key, 4)
    answered: set[str] = set()
    jobs.job_feed(job_id=job.pk, budget_s=0)
    worker_double.answer(worker_double.queued("batch")[0]["request_id"], "Kept.")
    answered.add(worker_double.queued("batch")[0]["request_id"])
    jobs.job_feed(job_id=job.pk, budget_s=0.2)
    auth = {"Authorization": f"Bearer {issued.plaintext}"}
    response = Client().post(f"/v1/jobs/{job.pk}/cancel", headers=auth)
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    assert response.json()["progress"] | {"total": 0} == {
        "total": 0, "pending": 0, "submitted": 0, "completed": 1, "failed": 0, "cancelled": 3,
    }  # fmt: skip
    items = _items(job)
    assert [i.status for i in items] == ["completed", "cancelled", "cancelled", "cancelled"]
    # Those in the scheduler are told to stop; the one never submitted has nothing to recall.
    in_scheduler = [str(i.generation_id) for i in items[1:] if i.generation_id]
    assert len(in_scheduler) == 2
    assert all(sync_redis().exists(keys.cancel(rid)) for rid in in_scheduler)
    # A late answer changes nothing, and no task feeds a cancelled job.
    _answer_new(answered)
    assert jobs.job_feed(job_id=job.pk, budget_s=0.2) is False
    assert [i.status for i in _items(job)] == ["completed", "cancelled", "cancelled", "cancelled"]
    assert len(worker_double.queued("batch")) == 3
    assert Client().post(f"/v1/jobs/{job.pk}/cancel", headers=auth).status_code == 200


def test_a_completed_job_cannot_be_cancelled(issued, api_key):
    job = _job(api_key, 1)
    jobs.job_feed(job_id=job.pk, budget_s=0)
    _answer_new(set())
    jobs.job_feed(job_id=job.pk, budget_s=1)
    response = Client().post(
        f"/v1/jobs/{job.pk}/cancel", headers={"Authorization": f"Bearer {issued.plaintext}"}
    )
    assert (response.status_code, response.json()["error"]["code"]) == (409, "job_completed")


def test_an_answer_that_fails_is_stored_as_a_failed_result(api_key):
    job = _job(api_key, 1)
    jobs.job_feed(job_id=job.pk, budget_s=0)
    [queued] = worker_double.queued("batch")
    worker_double.end(queued["request_id"], ("error", {"code": "engine_error", "message": "It broke."}))
    jobs.job_feed(job_id=job.pk, budget_s=1)
    [item] = _items(job)
    answer = item.generation
    assert (item.status, answer.error_code, answer.error_message) == ("failed", "engine_error", "It broke.")
    assert BatchJob.objects.get().status == "completed"


# --- the Celery tasks -------------------------------------------------------------------------


def test_a_task_whose_slice_ends_hands_the_job_to_a_fresh_task(api_key, settings):
    settings.BATCH_JOB_SLICE_S = 0
    job = _job(api_key, 1)
    tasks.job_run(str(job.pk))
    [(task, args)] = _tasks_sent()
    assert task == "api.tasks.job_run" and str(job.pk) in args
    assert BatchJob.objects.get().runner == ""  # free for that task at once


def test_a_task_hands_its_job_on_at_once_when_its_worker_shuts_down(api_key, settings):
    settings.BATCH_JOB_SLICE_S = 30
    job = _job(api_key, 1)
    tasks._worker_stopping.set()
    try:
        started = time.monotonic()
        tasks.job_run(str(job.pk))
        stopped_after_s = time.monotonic() - started
    finally:
        tasks._worker_stopping.clear()
    assert stopped_after_s < settings.BATCH_JOB_SLICE_S / 2  # not at the end of its slice
    assert [task for task, _ in _tasks_sent()] == ["api.tasks.job_run"]
    assert [i.status for i in _items(job)] == ["submitted"]


def test_the_sweep_restarts_only_jobs_whose_lease_ran_out(api_key):
    stalled, held, done = _job(api_key, 1), _job(api_key, 1), _job(api_key, 1)
    BatchJob.objects.filter(pk=stalled.pk).update(
        runner="dead", lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    BatchJob.objects.filter(pk=done.pk).update(status="completed", lease_expires_at=None)
    assert tasks.jobs_resume() == 1
    [(task, args)] = _tasks_sent()
    assert task == "api.tasks.job_run" and str(stalled.pk) in args
    assert held.pk not in jobs.job_ids_stalled()


# --- limits per owner, revoked keys, Celery queues ------------------------------------------------


def test_all_of_an_owner_s_jobs_share_one_rate_limit_client(api_key, settings):
    """Starting more jobs does not buy more of the batch tier: the owner's bucket is shared."""
    settings.BATCH_JOB_MAX_IN_FLIGHT = 10
    TierPolicy.objects.filter(tier="batch").update(bucket_capacity=3, refill_per_s=0.001)
    policies_mirror()
    first, second = _job(api_key, 2), _job(api_key, 2)
    jobs.job_feed(job_id=first.pk, budget_s=0)
    jobs.job_feed(job_id=second.pk, budget_s=0)
    assert len(worker_double.queued("batch")) == 3
    assert [i.status for i in _items(second)].count("pending") == 1
    # Another customer's job is not held back by this owner's use.
    other = api_keys.api_key_create(owner=User.objects.create(username="bob")).api_key
    third = _job(other, 2)
    jobs.job_feed(job_id=third.pk, budget_s=0)
    assert {i.status for i in _items(third)} == {"submitted"}


def test_a_job_s_requests_count_against_its_key_s_own_limits_with_its_other_requests(issued, api_key):
    """A key's requests per minute bound its batch items as its API calls: the job waits for
    the key's room (it does not fail), and an API call finds the room the job took."""
    ApiKey.objects.filter(pk=api_key.pk).update(requests_per_minute=2, tokens_per_minute=100)
    api_key.refresh_from_db()
    job = _job(api_key, 3)
    assert jobs.job_feed(job_id=job.pk, budget_s=0.1) is True
    assert [i.status for i in _items(job)] == ["submitted", "submitted", "pending"]
    call = Client().post(
        "/v1/chat/completions",
        json.dumps(_request(9)),
        content_type="application/json",
        headers={"Authorization": f"Bearer {issued.plaintext}"},
    )
    assert call.status_code == 429 and call.json()["error"]["type"] == "requests"
    # Each submitted item reserved its worst case from the key's tokens, as a call does.
    reserved = 100 - int(call["x-ratelimit-remaining-tokens"])
    assert reserved == pytest.approx(2 * jobs._tokens_at_most(_items(job)[0].request), abs=3)


def test_a_job_request_larger_than_its_key_s_tokens_per_minute_is_refused_for_good(issued, api_key):
    fits = _request(1) | {"max_tokens": 4}
    tokens = jobs._tokens_at_most({"messages": fits["messages"], "max_tokens": 4})
    ApiKey.objects.filter(pk=api_key.pk).update(tokens_per_minute=tokens)
    response = _post_job(issued.plaintext, {"requests": [fits, _request(2)]})  # 8 tokens: over by 4
    assert response.status_code == 429
    assert response.json()["error"]["param"] == "requests[1]"
    assert response["x-should-retry"] == "false"
    assert not BatchJob.objects.exists()


def test_an_item_its_key_s_lowered_limit_can_no_longer_admit_fails_and_the_job_ends(api_key):
    """The key's tokens per minute lowered below a posted item's size: that item would never
    be admitted. It fails with the reason, and the job goes on to its end."""
    job = _job(api_key, 2)
    tokens = jobs._tokens_at_most(_items(job)[0].request)
    ApiKey.objects.filter(pk=api_key.pk).update(tokens_per_minute=tokens - 1)
    answered: set[str] = set()
    for _ in range(3):
        jobs.job_feed(job_id=job.pk, budget_s=0.2)
        _answer_new(answered)
    assert not answered
    assert [item.status for item in _items(job)] == ["failed", "failed"]
    [code] = {item.generation.error_code for item in _items(job)}
    assert code == "rate_limit_exceeded"
    assert BatchJob.objects.get().status == "completed"


def test_an_owner_over_the_active_job_cap_gets_429_and_nothing_is_stored(issued, api_key, settings):
    settings.BATCH_JOB_MAX_ACTIVE_PER_OWNER = 2
    done = _job(api_key, 1)
    BatchJob.objects.filter(pk=done.pk).update(status="completed")
    _job(api_key, 1)
    assert _post_job(issued.plaintext, {"requests": [_request(1)]}).status_code == 202
    response = _post_job(issued.plaintext, {"requests": [_request(2)]})
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "too_many_active_jobs"
    assert response["x-should-retry"] == "false"
    assert BatchJob.objects.count() == 3
    # A second key of the same owner does not get around it.
    second_key = api_keys.api_key_create(owner=api_key.owner).plaintext
    assert _post_job(second_key, {"requests": [_request(3)]}).status_code == 429


def test_revoking_a_key_stops_its_jobs_with_a_clear_status(issued, api_key):
    job = _job(api_key, 3)
    jobs.job_feed(job_id=job.pk, budget_s=0)
    in_scheduler = [q["request_id"] for q in worker_double.queued("batch")]
    worker_double.answer(in_scheduler[0], "Kept.")
    jobs.job_feed(job_id=job.pk, budget_s=0.2)
    other_job = _job(api_keys.api_key_create(owner=api_key.owner).api_key, 1)

    assert api_keys.api_key_revoke(api_key=api_key)

    job.refresh_from_db()
    assert job.status == "key_revoked" and job.finished_at is not None
    assert [i.status for i in _items(job)] == ["completed", "cancelled", "cancelled"]
    assert all(sync_redis().exists(keys.cancel(rid)) for rid in in_scheduler[1:])
    assert jobs.job_feed(job_id=job.pk, budget_s=0.2) is False
    # The owner still sees why, with another key of theirs.
    other_key = api_keys.api_key_create(owner=api_key.owner).plaintext
    body = Client().get(f"/v1/jobs/{job.pk}", headers={"Authorization": f"Bearer {other_key}"}).json()
    assert body["status"] == "key_revoked"
    assert [r["error"]["code"] for r in body["results"][1:]] == ["key_revoked", "key_revoked"]
    # Jobs sent with the owner's other keys go on.
    other_job.refresh_from_db()
    assert other_job.status == "queued"


def test_job_slices_go_to_their_own_celery_queue_and_periodic_tasks_do_not(api_key, settings):
    """Slices run for a minute each: on the default queue, ten jobs would starve beat's tasks."""
    settings.BATCH_JOB_SLICE_S = 0
    job = _job(api_key, 1)
    tasks.job_run(str(job.pk))
    assert [task for task, _ in _tasks_sent("batch-jobs")] == ["api.tasks.job_run"]
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        app.send_task(entry["task"])
    sent_to_default = {task for task, _ in _tasks_sent("celery")}
    assert sent_to_default == {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert [task for task, _ in _tasks_sent("batch-jobs")] == ["api.tasks.job_run"]
