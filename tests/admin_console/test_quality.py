"""Scoring a variant's quality from the canary page: the task it starts, asking the variant's
workers through the queue, and the score shown beside the variant."""

import threading
import time

import pytest

from admin_console import tasks
from admin_console.models import CanaryRollout, QualityRun
from admin_console.services import canary as canary_services
from admin_console.services import variants as variants_services
from knowledge.answers import answer_plan
from knowledge.quality import VariantSettings, conversations_load
from scheduler import keys
from scheduler.models import Variant
from scheduler.redis import sync_redis
from tests.admin_console.conftest import CANDIDATE_MODEL, heartbeat, quality_scored
from tests.api.test_api_jobs import _tasks_sent
from tests.worker_double import done, publish, queued, tokens


def _start(client, variant: str, capture) -> object:
    with capture(execute=True):
        return client.post("/console/canary/quality/start", {"variant": variant}, follow=True)


@pytest.mark.django_db
def test_staff_start_a_score_and_see_it_running_beside_the_variant(
    client_staff, live_workers, django_capture_on_commit_callbacks
):
    page = _start(client_staff, "candidate", django_capture_on_commit_callbacks)
    run = QualityRun.objects.get()
    assert (run.variant, run.status, run.variant_settings["name"]) == ("candidate", "running", "candidate")
    assert [task for task, _ in _tasks_sent("batch-jobs")] == ["admin_console.tasks.quality_run"]
    assert "Quality score of candidate started." in page.content.decode()
    card = client_staff.get("/console/canary/quality").content.decode()
    assert "Running: 0/" in card and 'hx-trigger="every 2s"' in card
    # A second start while the first runs is refused, and sends nothing.
    again = _start(client_staff, "candidate", django_capture_on_commit_callbacks)
    assert "is running already" in again.content.decode()
    assert QualityRun.objects.count() == 1 and len(_tasks_sent("batch-jobs")) == 1


@pytest.mark.django_db
def test_a_score_asks_with_the_variant_s_settings_as_saved_when_it_starts(
    client_staff, live_workers, django_capture_on_commit_callbacks
):
    Variant.objects.filter(name="candidate").update(
        system_prompt="Answer like a pirate.",
        temperature=0.4,
        top_p=0.8,
        max_tokens=99,
        knowledge=False,
        frequency_penalty=0.5,
        answer_style="generated",
    )
    _start(client_staff, "candidate", django_capture_on_commit_callbacks)
    settings = VariantSettings(**QualityRun.objects.get().variant_settings)
    assert settings == VariantSettings(
        name="candidate",
        model=CANDIDATE_MODEL,
        system_prompt="Answer like a pirate.",
        temperature=0.4,
        top_p=0.8,
        max_tokens=99,
        frequency_penalty=0.5,
        knowledge=False,
        answer_style="generated",
    )
    plan = answer_plan(variant=settings.variant(), message="How long do I have to return an item?")
    assert plan.messages[0] == {"role": "system", "content": "Answer like a pirate."}


@pytest.mark.django_db
def test_a_variant_that_serves_nothing_cannot_be_scored(client_staff, live_workers):
    client_staff.post("/console/canary/quality/start", {"variant": "nobody"})
    assert not QualityRun.objects.exists()


@pytest.mark.django_db
def test_the_latest_scores_are_shown_beside_each_variant(client_staff, live_workers):
    quality_scored("stable", 0.512)
    quality_scored("candidate", 0.4)
    quality_scored("candidate", 0.634)
    page = client_staff.get("/console/canary").content.decode()
    stable_row = page.split('data-variant="stable"')[1].split("</tr>")[0]
    candidate_row = page.split('data-variant="candidate"')[1].split("</tr>")[0]
    assert "0.512" in stable_row and "0.634" in candidate_row and "0.400" not in page


class _WorkerDouble(threading.Thread):
    """Answers every job queued for `model` in the batch tier, as its worker would, and keeps
    its heartbeat alive (a run on a loaded machine outlasts one heartbeat's lifetime)."""

    def __init__(self, model: str, *, variant: str, worker_id: str) -> None:
        super().__init__(daemon=True)
        self.model = model
        self.variant = variant
        self.worker_id = worker_id
        self.stopping = threading.Event()
        self.answered: set[str] = set()

    def run(self) -> None:
        beaten_at = time.monotonic()
        while not self.stopping.is_set():
            if time.monotonic() - beaten_at > 1.0:
                heartbeat(self.variant, worker_id=self.worker_id)
                beaten_at = time.monotonic()
            for job in queued("batch", self.model):
                if job["request_id"] not in self.answered:
                    self.answered.add(job["request_id"])
                    publish(
                        job["request_id"],
                        *tokens("I'm sorry, ", "I don't know."),
                        done(),
                        model=self.model,
                    )
            time.sleep(0.01)


@pytest.mark.django_db(transaction=True)
def test_the_task_asks_every_question_of_the_variants_workers_and_stores_the_score(
    client_staff, staff, live_workers, tier_policies
):
    run = QualityRun.objects.create(
        variant="candidate",
        variant_settings=VariantSettings.of(Variant.objects.get(name="candidate")).as_dict(),
        started_by=staff,
    )
    worker = _WorkerDouble(CANDIDATE_MODEL, variant="candidate", worker_id=live_workers["candidate"])
    worker.start()
    try:
        tasks.quality_run(run.pk)
    finally:
        worker.stopping.set()
        worker.join()
    run.refresh_from_db()
    turns = sum(len(conversation.turns) for conversation in conversations_load())
    assert (run.status, run.answered, run.questions) == ("done", turns, turns)
    assert len(worker.answered) == turns  # an empty help center: every question asked of the model
    # Saying "I don't know" to everything: every unanswerable question right, no fact right.
    figures = run.breakdown
    assert (figures["declined_right"], figures["answered_right"], figures["invented"]) == (1.0, 0.0, 0.0)
    assert (figures["failed"], set(figures["sets"])) == (0, {"tuning", "heldout", "fresh"})
    page = client_staff.get("/console/canary").content.decode()
    assert f"{run.overall:.3f}" in page.split('data-variant="candidate"')[1].split("</tr>")[0]


@pytest.mark.django_db
def test_the_promote_button_refuses_a_candidate_scoring_below_stable_and_says_why(
    client_staff, staff, live_workers
):
    canary_services.canary_start(
        actor=staff, candidate_variant="candidate", steps=[{"percent": 100, "hold_s": 0}], rules={}
    )
    quality_scored("stable", 0.6)
    quality_scored("candidate", 0.55)
    page = client_staff.post("/console/canary/promote", follow=True).content.decode()
    assert "quality score (0.550) is below stable&#x27;s (0.600)" in page
    assert CanaryRollout.objects.get().status == "running"
    quality_scored("candidate", 0.6)
    page = client_staff.post("/console/canary/promote", follow=True).content.decode()
    assert "candidate is now the stable variant." in page


@pytest.mark.django_db
def test_a_candidate_edited_after_its_score_is_not_promoted_on_it(client_staff, staff, live_workers):
    canary_services.canary_start(
        actor=staff, candidate_variant="candidate", steps=[{"percent": 100, "hold_s": 0}], rules={}
    )
    quality_scored("stable", 0.6)
    quality_scored("candidate", 0.7)
    variants_services.variant_update(actor=staff, name="candidate", changes={"temperature": 0.9})
    page = client_staff.post("/console/canary/promote", follow=True).content.decode()
    assert "candidate changed since its last quality score" in page
    assert CanaryRollout.objects.get().status == "running"
    quality_scored("candidate", 0.7)  # scored again as it is now
    page = client_staff.post("/console/canary/promote", follow=True).content.decode()
    assert "candidate is now the stable variant." in page


@pytest.mark.django_db
def test_a_variant_without_a_live_worker_is_not_scored(client_staff):
    heartbeat("candidate")  # stable has no worker
    page = client_staff.post("/console/canary/quality/start", {"variant": "stable"}, follow=True)
    assert "No live worker serves &#x27;stable&#x27;" in page.content.decode()
    assert not QualityRun.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_score_whose_questions_go_unanswered_fails_and_says_so(
    client_staff, staff, live_workers, tier_policies, settings
):
    # Long enough for the first questions to be queued on a loaded machine.
    settings.QUALITY_RUN_TIMEOUT_S = 3
    run = QualityRun.objects.create(
        variant="candidate",
        variant_settings=VariantSettings.of(Variant.objects.get(name="candidate")).as_dict(),
        started_by=staff,
    )
    tasks.quality_run(run.pk)  # no worker answers
    run.refresh_from_db()
    assert (run.status, run.overall) == ("failed", None)
    # The questions still queued are cancelled: no worker spends a slot on them later.
    left = [job["request_id"] for job in queued("batch", CANDIDATE_MODEL)]
    assert left and all(sync_redis().exists(keys.cancel(request_id)) for request_id in left)
    card = client_staff.get("/console/canary/quality").content.decode()
    assert "Last run failed: Not finished within 3 s" in card
