import asyncio
import itertools
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from django.utils import timezone

from accounts.models import User
from admin_console.models import CONSOLE_ADMINISTRATORS, QualityRun
from chat.models import Conversation, Message
from knowledge.quality import VariantSettings
from scheduler import workers
from scheduler.models import Variant
from scheduler.redis import new_async_redis
from tests.generation_jobs import MODEL, generation_record

_ids = itertools.count()
CANDIDATE_MODEL = "candidate-model"


@pytest.fixture(autouse=True)
def candidate_on_a_model_of_its_own(variants) -> None:
    """The console's canary tests need the candidate's workers apart from stable's."""
    Variant.objects.filter(name="candidate").update(model=CANDIDATE_MODEL)


def console_administrator(username: str = "sam") -> User:
    """A staff account with every console power (the group admin_console's migration makes)."""
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.groups.add(Group.objects.get(name=CONSOLE_ADMINISTRATORS))
    return User.objects.get(pk=user.pk)  # permissions are cached per instance


@pytest.fixture
def staff() -> User:
    return console_administrator()


@pytest.fixture
def client_staff(staff) -> Client:
    client = Client()
    client.force_login(staff)
    return client


def heartbeat(
    variant: str,
    *,
    draining: bool = False,
    spare: bool = False,
    paused: int = 0,
    vip_waiting: bool = False,
    model: str | None = None,
    worker_id: str | None = None,
) -> str:
    """Make a worker serving the model of `variant` (or `model`) look alive (as its heartbeat
    would), a new one unless `worker_id` is given; returns its id."""
    worker_id = worker_id or f"worker-{variant}-{next(_ids)}"
    model = model or {"stable": MODEL, "candidate": CANDIDATE_MODEL}[variant]

    async def write():
        client = new_async_redis()
        try:
            await workers.heartbeat_write(
                client,
                worker_id=worker_id,
                info={
                    "model": model,
                    "engine": "simulated",
                    "slots": 8,
                    "running": 3,
                    "draining": draining,
                    "spare": spare,
                    "paused": paused,
                    "vip_waiting": vip_waiting,
                    "kv_cache_usage": 0.25,
                    "memory_used_bytes": 300 * 2**20,
                    "memory_total_bytes": 16 * 2**30,
                    "memory_source": "process-rss",
                    "prefix_cache_queries": 400,
                    "prefix_cache_hits": 300,
                },
                jobs_per_s=1.0,
                normal_jobs_per_s=0.8,
            )
        finally:
            await client.aclose()

    asyncio.run(write())
    return worker_id


@pytest.fixture
def live_workers() -> dict[str, str]:
    return {variant: heartbeat(variant) for variant in ("stable", "candidate")}


def answers(
    variant: str,
    count: int,
    *,
    errors: int = 0,
    ttft_ms: float = 100.0,
    thumbs_down: int = 0,
    thumbs_up: int = 0,
    ago_s: float = 0.0,
) -> None:
    """`count` finished answers of `variant`, the first `errors` of them failed."""
    conversation = Conversation.objects.create(session_key="answers")
    completed_at = timezone.now() - timedelta(seconds=ago_s)
    votes = [Message.Feedback.DOWN] * thumbs_down + [Message.Feedback.UP] * thumbs_up
    for n in range(count):
        failed = n < errors
        generation = generation_record(
            variant=variant,
            status="error" if failed else "done",
            error_code="engine_error" if failed else "",
            ttft_ms=None if failed else ttft_ms,
            finished_at=completed_at,
        )
        Message.objects.create(
            conversation=conversation,
            role=Message.Role.ASSISTANT,
            generation=generation,
            feedback=None if failed or n - errors >= len(votes) else votes[n - errors],
        )


def quality_scored(variant: str, overall: float) -> QualityRun:
    """A finished quality score of `variant`."""
    part = dict.fromkeys(("answered_right", "declined_right", "language"), overall)
    return QualityRun.objects.create(
        variant=variant,
        status=QualityRun.Status.DONE,
        variant_settings=VariantSettings.of(Variant.objects.get(name=variant)).as_dict(),
        answered=230,
        questions=230,
        overall=overall,
        breakdown={**part, "invented": 0.0, "overall": overall, "questions": 230, "failed": 0, "sets": {}},
        finished_at=timezone.now(),
    )
