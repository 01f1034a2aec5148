"""The quality score of a variant: a fixed set of customer questions (`quality_questions.json`),
asked with the prompt the chat builds and the variant's settings, and graded on what a customer
would notice: the facts of the help center, the article quoted, "I don't know" where the help
center has no answer, an answer in the customer's language, and one that reads as an answer
(it says something, and no sentence of it twice).

Two steps, so that the database is read outside the event loop that waits for answers:
`quality_prompts` (sync: retrieval, as a chat post does it), then `answers_collect` (async: asks
an `Answerer`, a variant's workers through the queue or an engine in the benchmark's process,
and grades each answer with `question_grade`, summed up by `quality_score`). A question the help
center has nothing on gets the chat's reply without the model, as in the chat, when the
variant has that reply on.

A score never goes through the result cache: it measures the variant's model and prompt
(`python -m bench quality` measures what the cache does to the answers).
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from channels.db import database_sync_to_async

from knowledge.language import text_language
from knowledge.prompts import system_prompt_build, unknown_reply
from scheduler import control
from scheduler.admission import AdmissionRefused, request_submit
from scheduler.generation import (
    AnswerFold,
    Error,
    GenerationJob,
    Origin,
    SamplingParams,
    Tier,
)
from scheduler.models import Variant
from scheduler.policy import tier_policy
from scheduler.results import result_follower
from scheduler.rules import answer_wait_limit_s

QUESTIONS_PATH = Path(__file__).resolve().parent / "quality_questions.json"

# --- the variant --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VariantSettings:
    """What a variant answers with, as far as the score is concerned: a copy of its
    scheduler.models.Variant row (`of`) taken when the score starts, so that an edit made while
    it runs changes nothing of what it measures."""

    name: str
    assistant_prompt: str
    temperature: float
    top_p: float
    max_tokens: int
    use_help_center: bool = True
    model: str = ""  # whose workers answer through the queue; "" for an engine in this process
    frequency_penalty: float = 0.0
    unknown_reply: bool = True  # the help center's reply when it has nothing on a question

    @classmethod
    def of(cls, variant: Variant) -> VariantSettings:
        return cls(
            name=variant.name,
            assistant_prompt=variant.system_prompt,
            temperature=variant.temperature,
            top_p=variant.top_p,
            max_tokens=variant.max_tokens,
            use_help_center=variant.knowledge,
            model=variant.model,
            frequency_penalty=variant.frequency_penalty,
            unknown_reply=variant.unknown_reply,
        )

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            frequency_penalty=self.frequency_penalty,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- the questions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QualityQuestion:
    id: str
    question: str
    language: str = "en"
    source: str = ""  # the article slug the answer comes from; "" when unanswerable
    # Case-insensitive regular expressions a right answer matches, each as whole words ("no"
    # is not found in "know").
    facts: tuple[str, ...] = ()
    unanswerable: bool = False


def quality_questions(path: Path = QUESTIONS_PATH) -> list[QualityQuestion]:
    return [
        QualityQuestion(
            id=row["id"],
            question=row["question"],
            language=row.get("language", "en"),
            source=row.get("source", ""),
            facts=tuple(row.get("facts", ())),
            unanswerable=bool(row.get("unanswerable", False)),
        )
        for row in json.loads(path.read_text())["questions"]
    ]


# --- grading ------------------------------------------------------------------------------------

_DONT_KNOW = re.compile(
    r"(don'?t|do not|doesn'?t|does not) (know|have (any )?(information|details))|not sure|"
    r"no information|unable to|can'?t help|cannot help|could(n'?t| not) find|"
    r"(person|someone|member) (from|of|on) our team|sorry|"
    r"je ne sais pas|pas d'information|rien trouvé|désolée?|"
    r"no sé|no tengo información|no (he )?encontrado|lo siento|"
    r"weiß (ich )?nicht|keine informationen|nichts gefunden|tut mir leid|leider",
    re.IGNORECASE,
)


def says_dont_know(text: str) -> bool:
    return bool(_DONT_KNOW.search(text))


_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n+")


def repeats_itself(text: str) -> bool:
    """Whether a sentence of four words or more comes back word for word (case and spacing
    aside): what a small model decoding greedily does until its token limit, and what a
    customer reads as a broken answer."""
    sentences = [" ".join(part.lower().split()) for part in _SENTENCE_BREAK.split(text)]
    sentences = [sentence for sentence in sentences if len(sentence.split()) >= 4]
    return len(sentences) != len(set(sentences))


@dataclass(frozen=True, slots=True)
class QuestionResult:
    id: str
    answer: str
    sources: tuple[str, ...]  # the articles the answer quoted (shown under it in the chat)
    facts_found: int
    facts_total: int
    source_right: bool | None  # None: unanswerable
    dont_know_right: bool | None  # None: answerable
    language_right: bool
    readable: bool = True  # says something, and no sentence of it twice


def question_grade(question: QualityQuestion, *, answer: str, sources: Sequence[str]) -> QuestionResult:
    found = sum(
        bool(re.search(rf"(?<!\w)(?:{fact})(?!\w)", answer, re.IGNORECASE)) for fact in question.facts
    )
    return QuestionResult(
        id=question.id,
        answer=answer,
        sources=tuple(sources),
        facts_found=found,
        facts_total=len(question.facts),
        source_right=None if question.unanswerable else question.source in sources,
        dont_know_right=says_dont_know(answer) if question.unanswerable else None,
        language_right=text_language(answer) == question.language,
        readable=bool(answer.strip()) and not repeats_itself(answer),
    )


def _rate(values: Sequence[float | bool]) -> float:
    return round(sum(values) / len(values), 4) if values else 0.0


@dataclass(frozen=True, slots=True)
class QualityScore:
    """Each part is a share from 0 to 1; `overall` is their mean."""

    facts: float  # of the required facts, over answerable questions
    sources: float  # answerable questions whose article was quoted
    dont_know: float  # unanswerable questions answered with "I don't know"
    language: float  # answers in the question's language
    readable: float  # answers that say something and repeat no sentence
    overall: float
    questions: int
    failed: int  # questions that got no answer (an error); graded as empty answers
    results: tuple[QuestionResult, ...] = field(default=(), repr=False)

    def breakdown(self) -> dict[str, Any]:
        """The figures without the answers, as stored and shown."""
        return {
            "facts": self.facts,
            "sources": self.sources,
            "dont_know": self.dont_know,
            "language": self.language,
            "readable": self.readable,
            "overall": self.overall,
            "questions": self.questions,
            "failed": self.failed,
        }


def quality_score(results: Sequence[QuestionResult], *, failed: int = 0) -> QualityScore:
    answerable = [r for r in results if r.dont_know_right is None]
    facts = _rate([r.facts_found / r.facts_total for r in answerable if r.facts_total])
    sources = _rate([bool(r.source_right) for r in answerable])
    dont_know = _rate([bool(r.dont_know_right) for r in results if r.dont_know_right is not None])
    language = _rate([r.language_right for r in results])
    readable = _rate([r.readable for r in results])
    return QualityScore(
        facts=facts,
        sources=sources,
        dont_know=dont_know,
        language=language,
        readable=readable,
        overall=round((facts + sources + dont_know + language + readable) / 5, 4),
        questions=len(results),
        failed=failed,
        results=tuple(results),
    )


# --- asking -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QualityPrompt:
    question: QualityQuestion
    messages: list[dict[str, str]]
    sources: tuple[str, ...]
    # What the chat replies without asking the model (the help center has nothing on it).
    reply: str | None = None


def quality_prompts(
    *, variant: VariantSettings, questions: Sequence[QualityQuestion] | None = None
) -> list[QualityPrompt]:
    """Each question as the chat would send it as a conversation's first message (reads the
    help center: call it outside an event loop)."""
    prompts = []
    for question in questions if questions is not None else quality_questions():
        system_prompt = system_prompt_build(
            question=question.question,
            assistant_prompt=variant.assistant_prompt,
            use_help_center=variant.use_help_center,
        )
        messages = [
            {"role": "system", "content": system_prompt.text},
            {"role": "user", "content": question.question},
        ]
        sources = tuple(s.slug for s in system_prompt.sources)
        reply = None
        if variant.unknown_reply and system_prompt.found_nothing:
            reply = unknown_reply(question.question)
        prompts.append(QualityPrompt(question, messages, sources, reply))
    return prompts


class AnswerFailed(RuntimeError):
    """A question got no answer; it is graded as an empty one."""


class Answerer(Protocol):
    async def __call__(self, messages: list[dict[str, str]], sampling: SamplingParams) -> str: ...


def queue_answerer(*, variant: str, model: str) -> Answerer:
    """Answers from the live workers serving `variant`'s `model`, through admission and the batch tier's
    queue, so that a score never takes capacity from customers. A refusal waits as long as it
    says and tries again, within the tier's longest answer wait."""

    async def answer(messages: list[dict[str, str]], sampling: SamplingParams) -> str:
        wait_limit_s = answer_wait_limit_s((await database_sync_to_async(tier_policy)(Tier.BATCH)).max_wait_s)
        async with asyncio.timeout(wait_limit_s):
            while True:
                job = GenerationJob(
                    request_id=str(uuid.uuid4()),
                    origin=Origin.QUALITY,
                    messages=messages,
                    sampling=sampling,
                    client_id=f"quality:{variant}",
                    tier=Tier.BATCH,
                    variant=variant,
                    model=model,
                    disconnect_grace_s=None,
                )
                try:
                    await database_sync_to_async(request_submit)(job=job)
                except AdmissionRefused as refusal:
                    await asyncio.sleep(max(refusal.retry_after_s, 1))
                    continue
                break
            try:
                async with result_follower().subscribe(
                    model=model, request_id=job.request_id, after_id="0-0"
                ) as subscription:
                    fold = AnswerFold()
                    while not fold.finished:
                        fold.add_all(event.body for event in await subscription.next_batch(wait_limit_s))
            except asyncio.CancelledError:
                # The run gave up (its timeout): no worker should spend a slot on this question.
                control.request_cancel(request_id=job.request_id)
                raise
        if isinstance(fold.end, Error):
            raise AnswerFailed(f"{fold.end.code}: {fold.end.message}")
        return fold.text

    return answer


async def answers_collect(
    prompts: Sequence[QualityPrompt],
    *,
    variant: VariantSettings,
    answerer: Answerer,
    concurrency: int = 16,
    progress: Callable[[int, int], Awaitable[None] | None] | None = None,
) -> QualityScore:
    """Ask every prompt (`concurrency` at a time, so the engine batches them) and grade it.
    `progress(done, total)` is called after each answer."""
    slots = asyncio.Semaphore(concurrency)
    done = 0
    failed = 0

    async def ask(prompt: QualityPrompt) -> QuestionResult:
        nonlocal done, failed
        async with slots:
            try:
                answer = prompt.reply or await answerer(prompt.messages, variant.sampling)
            except (AnswerFailed, TimeoutError):
                answer = ""
                failed += 1
        done += 1
        if progress is not None:
            reported = progress(done, len(prompts))
            if reported is not None:
                await reported
        return question_grade(prompt.question, answer=answer, sources=prompt.sources)

    results = await asyncio.gather(*(ask(prompt) for prompt in prompts))
    return quality_score(results, failed=failed)
