"""Answers for `python -m bench quality` from an engine in this process: asked as the quality
score asks a variant's workers (knowledge.quality), or as customers' first messages through the
result cache, which measures what the cache does to the answers.

Imported once Django is set up (bench.quality sets up its own database first).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from channels.db import database_sync_to_async

from inference.engines.base import Engine, GenerationRequest
from knowledge import cache as answer_cache
from knowledge.index import knowledge_base_version
from knowledge.prompts import system_prompt_build, unknown_reply
from knowledge.quality import Answerer, QualityQuestion, QualityScore, quality_score, question_grade
from knowledge.selectors import question_vector
from scheduler.generation import GenerationJob, Origin, SamplingParams, Tier, Timings, Usage
from scheduler.models import CacheResult, Generation, Variant
from scheduler.services import GenerationOutcome, generation_cache_note, generation_create, generation_finish


def engine_answerer(engine: Engine) -> Answerer:
    """Answers from an engine in this process (started by the caller)."""

    async def answer(messages: list[dict[str, str]], sampling: SamplingParams) -> str:
        request = GenerationRequest(
            request_id=f"quality-{uuid.uuid4()}", messages=messages, sampling=sampling
        )
        return "".join([delta.text async for delta in engine.generate(request)])

    return answer


# --- through the result cache -------------------------------------------------------------------


def cache_rounds(questions: Sequence[QualityQuestion]) -> list[list[QualityQuestion]]:
    """The questions in rounds, as customers would ask them over a day: round n holds the n-th
    question on each article (and the n-th of those the help center cannot answer), so a
    paraphrase is asked once the question it rewords was answered and could be served; then a
    last round asks every question again, word for word, as the next customer with the same
    question does (its id marked `#again`)."""
    rounds: list[list[QualityQuestion]] = []
    asked: Counter[str] = Counter()
    for question in questions:
        n = asked[question.source]
        asked[question.source] += 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append(question)
    rounds.append([replace(question, id=f"{question.id}#again") for question in questions])
    return rounds


@dataclass(frozen=True, slots=True)
class _FirstTurn:
    """A question posted as a guest's first message: answered without the model (`served`:
    from the cache, `match` saying how, or the help center's reply when it has nothing), or
    the job that answers it, its record written and its question remembered, as a chat post
    does."""

    question: QualityQuestion
    sources: tuple[str, ...]
    served: str | None = None
    match: str = ""  # how a served answer matched (knowledge.cache)
    job: GenerationJob | None = None


def _first_turn(question: QualityQuestion, variant: Variant) -> _FirstTurn:
    """chat.services.message_post's steps for a guest's first message (sync: reads the
    database), without the queue: the engine in this process answers the job."""
    text = question.question
    # As chat: a question with personal data is neither looked up nor remembered.
    cacheable = not answer_cache.question_personal(text)
    vector = question_vector(text) if cacheable else None
    context = answer_cache.chat_context(variant)
    lookup = None
    if vector is not None:
        lookup = answer_cache.answer_lookup(
            variant=variant.name, context=context, question=text, vector=vector
        )
        if lookup.answer is not None:
            sources = tuple(source["slug"] for source in lookup.sources)
            return _FirstTurn(question, sources, lookup.answer.text, lookup.answer.cache)
    system_prompt = system_prompt_build(
        question=text,
        assistant_prompt=variant.system_prompt,
        use_help_center=variant.knowledge,
        vector=vector,
    )
    if variant.unknown_reply and system_prompt.found_nothing:
        return _FirstTurn(question, (), unknown_reply(text))
    job = GenerationJob(
        request_id=str(uuid.uuid4()),
        origin=Origin.QUALITY,
        messages=[{"role": "system", "content": system_prompt.text}, {"role": "user", "content": text}],
        sampling=variant.sampling(),
        client_id="quality:cache",
        tier=Tier.NORMAL,
        variant=variant.name,
        model=variant.model,
        disconnect_grace_s=None,
    )
    generation_create(job=job)
    sources = tuple(source.slug for source in system_prompt.sources)
    if lookup is not None and vector is not None:
        generation_cache_note(request_id=job.request_id, result=CacheResult.MISS, lookup_ms=lookup.lookup_ms)
        kb_version = system_prompt.kb_version
        answer_cache.answer_remember(
            variant=variant.name,
            context=context,
            question=text,
            vector=vector,
            kb_version=knowledge_base_version() if kb_version is None else kb_version,
            help_center=variant.knowledge,
            source_slugs=sources,
            request_id=job.request_id,
        )
    return _FirstTurn(question, sources, job=job)


async def _engine_outcome(engine: Engine, job: GenerationJob) -> GenerationOutcome:
    """The job's answer from the engine, as its worker would record it: the finish reason
    decides whether the cache may serve it."""
    started = time.monotonic()
    ttft_ms: float | None = None
    text: list[str] = []
    prompt_tokens = output_tokens = 0
    finish_reason = ""
    request = GenerationRequest(request_id=job.request_id, messages=job.messages, sampling=job.sampling)
    async for delta in engine.generate(request):
        if ttft_ms is None:
            ttft_ms = (time.monotonic() - started) * 1000
        text.append(delta.text)
        prompt_tokens, output_tokens = delta.prompt_tokens, delta.output_tokens
        finish_reason = delta.finish_reason or finish_reason
    return GenerationOutcome(
        status=Generation.Status.DONE,
        text="".join(text),
        finish_reason=finish_reason,
        usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=output_tokens),
        timings=Timings(
            queue_ms=0.0,
            ttft_ms=ttft_ms,
            duration_ms=(time.monotonic() - started) * 1000,
            engine=engine.label,
        ),
    )


@dataclass(frozen=True, slots=True)
class CachedScore:
    """A score whose answers went through the result cache, and which of them it served."""

    score: QualityScore
    served: dict[str, str]  # asking's id -> how the cache matched (exact, semantic, pinned)

    @property
    def hit_rate(self) -> float:
        results = self.score.results
        return (
            round(sum(result.id in self.served for result in results) / len(results), 4) if results else 0.0
        )


async def cached_answers_collect(
    questions: Sequence[QualityQuestion],
    *,
    variant: Variant,
    engine: Engine,
    concurrency: int = 16,
    progress: Callable[[int, int], Awaitable[None] | None] | None = None,
) -> CachedScore:
    """Ask every question as a first turn on `variant`, in `cache_rounds`, the way the chat
    serves it: a question the result cache can answer (knowledge.cache.answer_lookup decides)
    gets the cached answer and its articles; one the help center has nothing on gets its reply;
    a miss is answered by `engine` (started by the caller) and remembered, then finished as its
    worker would, so later rounds may be served it. Grades every asking like
    knowledge.quality.answers_collect."""
    slots = asyncio.Semaphore(concurrency)
    rounds = cache_rounds(questions)
    total = sum(len(round_questions) for round_questions in rounds)
    turns: dict[str, _FirstTurn] = {}
    answers: dict[str, str] = {}

    async def ask(question: QualityQuestion) -> None:
        async with slots:
            turn = await database_sync_to_async(_first_turn)(question, variant)
            turns[question.id] = turn
            if turn.job is None:
                answers[question.id] = turn.served or ""
            else:
                outcome = await _engine_outcome(engine, turn.job)
                await database_sync_to_async(generation_finish)(
                    request_id=turn.job.request_id, outcome=outcome
                )
                answers[question.id] = outcome.text
        if progress is not None:
            reported = progress(len(answers), total)
            if reported is not None:
                await reported

    asked: list[QualityQuestion] = []
    for round_questions in rounds:
        await asyncio.gather(*(ask(question) for question in round_questions))
        asked += round_questions
    results = [
        question_grade(question, answer=answers[question.id], sources=turns[question.id].sources)
        for question in asked
    ]
    served = {turn.question.id: turn.match for turn in turns.values() if turn.match}
    return CachedScore(quality_score(results), served)
