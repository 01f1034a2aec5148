"""The generation contract: the job and the events survive their trip through Redis as they
were sent, the fold tells the answer as a reader must show it, and the record is made at
admission and gone when admission refuses."""

import json

import pytest
from django.test import override_settings

from scheduler import keys
from scheduler.admission import CACHE, AdmissionRefused, KnownAnswer, request_answer_known, request_submit
from scheduler.generation import (
    AnswerFold,
    CalledTool,
    Done,
    Error,
    GenerationJob,
    Origin,
    ParsedAnswer,
    ParsedDelta,
    Queued,
    Reset,
    SamplingParams,
    Start,
    StructuredOutput,
    Tier,
    Timings,
    Token,
    TokenLogprob,
    ToolCallDelta,
    ToolParsing,
    TopLogprob,
    Usage,
    event_decode,
    event_encode,
)
from scheduler.models import Generation, TierPolicy
from scheduler.policy import policies_mirror
from scheduler.redis import sync_redis
from scheduler.services import GenerationOutcome, generation_finish
from tests.generation_jobs import MODEL, generation_job


def test_a_job_decodes_to_what_was_encoded():
    job = GenerationJob(
        request_id="5d0c7f0e-0000-4000-8000-000000000001",
        origin=Origin.API,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        sampling=SamplingParams(max_tokens=12, temperature=0.2, top_p=0.5, stop=("\n\n",)),
        client_id="key:7",
        tier=Tier.VIP,
        variant="candidate",
        model="smollm2",
        disconnect_grace_s=None,
        choice=2,
        key_client_id="key:7",
        tool_parsing=ToolParsing(
            parser="pythonic",
            tools=[{"type": "function", "function": {"name": "f"}}],
            parallel_tool_calls=False,
        ),
        conversation_id="6f1c2a52-93a4-4a43-9f0e-3c1d0c2b7a10",
    )
    assert GenerationJob.decode(job.encode()) == job


def test_sampling_stored_before_a_parameter_existed_decodes_to_its_default():
    stored = {"max_tokens": 12, "temperature": 0.2, "top_p": 0.5, "stop": []}  # an older batch item
    assert SamplingParams.from_dict(stored) == SamplingParams(max_tokens=12, temperature=0.2, top_p=0.5)


def test_a_job_with_every_sampling_parameter_decodes_to_what_was_encoded():
    sampling = SamplingParams(
        max_tokens=12,
        temperature=0.9,
        top_p=0.5,
        seed=-3,
        repetition_penalty=1.1,
        stop_token_ids=(2,),
        logprobs=5,
        logit_bias={50: -100.0},
        structured=StructuredOutput(json_schema={"type": "object"}),
    )
    job = generation_job()
    job = GenerationJob(**{**{f: getattr(job, f) for f in job.__dataclass_fields__}, "sampling": sampling})
    assert GenerationJob.decode(job.encode()) == job


def test_a_text_completion_job_keeps_its_raw_prompt():
    job = GenerationJob(
        request_id="5d0c7f0e-0000-4000-8000-000000000002",
        origin=Origin.API,
        messages=[],
        sampling=SamplingParams(max_tokens=16, temperature=0.0, top_p=1.0),
        client_id="key:7",
        tier=Tier.NORMAL,
        variant="stable",
        model=MODEL,
        disconnect_grace_s=30.0,
        prompt="<|im_start|>user\nOnce upon a time",
    )
    assert GenerationJob.decode(job.encode()) == job


@pytest.mark.parametrize(
    "body",
    [
        Queued(seq=3, tier=Tier.BATCH),
        Start(worker="w-1", variant="stable", attempt=2),
        Token(seq=0, text="Hello "),
        Token(
            seq=1,
            text="there",
            logprobs=(
                TokenLogprob(
                    "there", -0.5, [116], (TopLogprob("there", -0.5, [116]), TopLogprob("you", -9999.0, None))
                ),
            ),
        ),
        Token(seq=2, text="[f(", parsed=ParsedDelta()),
        Token(
            seq=3,
            text="a=1)]",
            parsed=ParsedDelta(
                tool_calls=(ToolCallDelta(index=0, id="chatcmpl-tool-1", name="f", arguments="{"),)
            ),
        ),
        Reset(reason="worker_restarted", attempt=2),
        Done(finish_reason="length", usage=Usage(5, 7), timings=Timings(1.0, 2.0, 30.0, "simulated")),
        Done(
            finish_reason="stop", parsed=ParsedAnswer(content=None, tool_calls=(CalledTool("f", '{"a": 1}'),))
        ),
        Done(finish_reason="cancelled"),
        Error(code="timeout", message="Too slow."),
    ],
)
def test_each_event_decodes_to_what_was_encoded(body):
    kind, data = event_encode(body)
    assert event_decode(kind, json.loads(data)) == body


def test_an_unknown_event_type_is_refused():
    with pytest.raises(ValueError, match="unknown result event"):
        event_decode("surprise", {})


def test_the_fold_keeps_the_text_since_the_last_reset_and_stops_at_the_end():
    answer = AnswerFold().add_all(
        [
            Start(worker="w", variant="v", attempt=1),
            Token(0, "Lost "),
            Reset(reason="worker_restarted", attempt=2),
            Token(0, "Kept "),
            Token(1, "text."),
            Error(code="engine_error", message="Broke."),
            Token(2, "after the end"),
        ]
    )
    assert (answer.text, answer.end) == ("Kept text.", Error(code="engine_error", message="Broke."))


def test_the_fold_hands_out_new_text_once_and_notices_a_reset_after_text_went_out():
    answer = AnswerFold()
    answer.add_all([Token(0, "Your "), Reset(reason="worker_restarted", attempt=2)])
    assert (answer.unsent(), answer.restarted_after_sending) == ("", False)  # nothing went out yet
    answer.add_all([Token(0, "Your "), Token(1, "order ")])
    assert answer.unsent() == "Your order "
    assert answer.unsent() == ""
    answer.add(Reset(reason="worker_restarted", attempt=3))
    assert answer.restarted_after_sending


def test_the_fold_drops_a_repeated_token_and_counts_a_gap():
    """A stream resumed from too far back repeats tokens; one resumed from too far ahead
    skips some: a reader sees neither twice in its text, and a checker sees both counted."""
    answer = AnswerFold().add_all(
        [Token(0, "Your "), Token(1, "order "), Token(1, "order "), Token(3, "today.")]
    )
    assert (answer.text, answer.repeated, answer.skipped) == ("Your order today.", 1, 1)
    # After a gap the numbering goes on from the token past it, not from the count kept.
    answer.add_all([Token(4, " Thanks"), Token(3, "today."), Token(5, "!")])
    assert (answer.text, answer.repeated, answer.skipped) == ("Your order today. Thanks!", 2, 1)
    answer.add(Reset(reason="worker_restarted", attempt=2))
    answer.add(Token(0, "Again."))
    assert (answer.text, answer.resets) == ("Again.", 1)


@pytest.mark.django_db
def test_an_admitted_request_has_a_pending_record():
    job = generation_job(tier=Tier.VIP, variant="candidate", client_id="key:3", origin=Origin.API)
    request_submit(job=job)
    record = Generation.objects.get(request_id=job.request_id)
    assert (record.origin, record.tier, record.variant, record.client_id, record.status) == (
        "api",
        "vip",
        "candidate",
        "key:3",
        "pending",
    )


@pytest.mark.django_db
def test_a_refused_request_leaves_no_record():
    TierPolicy.objects.filter(tier="normal").update(bucket_capacity=1, refill_per_s=0.001)
    policies_mirror()
    request_submit(job=generation_job(client_id="user:1"))
    refused = generation_job(client_id="user:1")
    with pytest.raises(AdmissionRefused):
        request_submit(job=refused)
    assert not Generation.objects.filter(request_id=refused.request_id).exists()
    assert Generation.objects.count() == 1


@pytest.mark.django_db
def test_an_answer_with_a_nul_character_is_stored_all_the_same():
    job = generation_job()
    request_submit(job=job)
    outcome = GenerationOutcome(status=Generation.Status.DONE, text="a\x00b", finish_reason="stop")
    assert generation_finish(request_id=job.request_id, outcome=outcome)
    assert Generation.objects.get(request_id=job.request_id).text == "a\ufffdb"


_CACHED = KnownAnswer(
    "Orders ship in 2 days.", CACHE, lookup_ms=3.0, completion_tokens=6, cache="exact", saved_engine_ms=900.0
)


@pytest.mark.django_db
def test_an_answer_from_the_cache_is_recorded_and_streamed_as_a_workers_would_be():
    job = generation_job()
    request_answer_known(job=job, answer=_CACHED)
    record = Generation.objects.get(request_id=job.request_id)
    assert (record.status, record.text, record.engine, record.cache) == (
        "done",
        _CACHED.text,
        "cache",
        "exact",
    )
    assert (record.cache_lookup_ms, record.saved_engine_ms, record.completion_tokens) == (3.0, 900.0, 6)
    entries = sync_redis().xrange(keys.result(MODEL, job.request_id))
    bodies = [event_decode(fields["type"], json.loads(fields["data"])) for _, fields in entries]
    answer = AnswerFold().add_all(bodies)
    assert (answer.text, answer.end.cached) == (_CACHED.text, True)


@pytest.mark.django_db
def test_an_answer_from_the_cache_that_redis_cannot_take_leaves_no_record():
    job = generation_job()
    sync_redis.cache_clear()
    try:
        with override_settings(REDIS_URL="redis://127.0.0.1:1/0"), pytest.raises(AdmissionRefused) as refused:
            request_answer_known(job=job, answer=_CACHED)
    finally:
        sync_redis.cache_clear()
    assert refused.value.status == 503
    assert not Generation.objects.filter(request_id=job.request_id).exists()
