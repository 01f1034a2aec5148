"""The quality score of a variant: customer conversations (knowledge/questions/*.json) asked as
the chat asks them (knowledge.answers, history and all, turn by turn), and graded on what a
customer would notice:
- answered right: an answerable question's answer states every fact asked for (and none of
  the wrong ones the set names), and is not the decline;
- declined right: a question the help center cannot answer gets the honest decline;
- invented: an answer states a fact (an amount, a percentage, a duration, a number, a contact,
  a name: knowledge.facts) that neither the help center's text it was given nor the question
  holds;
- in the customer's language.
`overall` is the mean of answered right, declined right and answers with nothing invented. The
console's score, the canary's quality gate and `python -m bench quality` all use this measure.

The questions come in three sets, each reported apart: `tuning` (what retrieval, the decline
rules and the styles were chosen on), `heldout` (not looked at while choosing, but its figures
were seen as choices were made) and `fresh` (written from the help center's articles alone, never
used to choose anything: the measure of how the chat does on questions nobody tuned against).

Two steps per turn, so that the database is read outside the event loop that waits for
answers: `answer_plan` (sync: retrieval, as a chat post does it), then, for a model's answer,
an `Answerer` (async: a variant's workers through the queue, or an engine in the benchmark's
process, which checks a verified answer with the same knowledge.grounding as the worker).
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

from knowledge.answers import AnswerPlan, answer_plan
from knowledge.facts import unsupported_facts
from knowledge.language import text_language
from scheduler import control
from scheduler.admission import AdmissionRefused, request_submit
from scheduler.generation import AnswerFold, Error, GenerationJob, Grounding, Origin, SamplingParams, Tier
from scheduler.models import Variant
from scheduler.policy import tier_policy
from scheduler.results import result_follower
from scheduler.rules import answer_wait_limit_s

QUESTIONS_DIR = Path(__file__).resolve().parent / "questions"
QUESTION_SETS = ("tuning", "heldout", "fresh")

# --- the variant --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VariantSettings:
    """What a variant answers with: a copy of its scheduler.models.Variant row (`of`) taken when
    the score starts, so that an edit made while it runs changes nothing of what it measures."""

    name: str
    model: str
    system_prompt: str
    temperature: float
    top_p: float
    max_tokens: int
    frequency_penalty: float = 0.0
    knowledge: bool = True
    answer_style: str = Variant.AnswerStyle.EXTRACTIVE

    @classmethod
    def of(cls, variant: Variant) -> VariantSettings:
        return cls(
            name=variant.name,
            model=variant.model,
            system_prompt=variant.system_prompt,
            temperature=variant.temperature,
            top_p=variant.top_p,
            max_tokens=variant.max_tokens,
            frequency_penalty=variant.frequency_penalty,
            knowledge=variant.knowledge,
            answer_style=variant.answer_style,
        )

    def variant(self) -> Variant:
        """An unsaved Variant with these settings, as answer_plan reads one."""
        return Variant(**asdict(self))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- the questions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Turn:
    question: str
    expect: str  # "answer" or "decline"
    sources: tuple[str, ...] = ()  # the articles (slugs) that answer it
    # Case-insensitive regular expressions, each matched as a whole word: a right answer matches
    # every one of `facts` and none of `wrong`.
    facts: tuple[str, ...] = ()
    wrong: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Conversation:
    id: str
    language: str
    turns: tuple[Turn, ...]
    set: str = "tuning"
    tags: tuple[str, ...] = ()


def conversations_load(sets: Sequence[str] = QUESTION_SETS) -> list[Conversation]:
    conversations = []
    for name in sets:
        data = json.loads((QUESTIONS_DIR / f"{name}.json").read_text())
        for row in data["conversations"]:
            conversations.append(
                Conversation(
                    id=row["id"],
                    language=row["language"],
                    set=name,
                    tags=tuple(row.get("tags", ())),
                    turns=tuple(
                        Turn(
                            question=turn["question"],
                            expect=turn["expect"],
                            sources=tuple(turn.get("sources", ())),
                            facts=tuple(turn.get("facts", ())),
                            wrong=tuple(turn.get("wrong", ())),
                        )
                        for turn in row["turns"]
                    ),
                )
            )
    return conversations


# --- grading ------------------------------------------------------------------------------------

_DONT_KNOW = re.compile(
    r"(don'?t|do not|doesn'?t|does not) (know|have (any )?(information|details))|not sure|"
    r"no information|unable to|can'?t help|cannot help|could(n'?t| not) find|"
    r"je ne sais pas|pas d'information|pas trouvé|rien trouvé|"
    r"no sé|no tengo información|no (he )?encontrado|"
    r"weiß (ich )?nicht|keine informationen|nichts gefunden",
    re.IGNORECASE,
)


def says_dont_know(text: str) -> bool:
    return bool(_DONT_KNOW.search(text))


def fact_holds(pattern: str, text: str) -> bool:
    """Whether `text` states the fact `pattern` (a regular expression, as a whole word or phrase,
    in any case)."""
    return bool(re.search(rf"(?<!\w)(?:{pattern})(?!\w)", text, re.IGNORECASE))


@dataclass(frozen=True, slots=True)
class TurnResult:
    conversation: str
    turn: int
    set: str
    language: str
    question: str
    expect: str
    answer: str
    declined: bool
    invented: tuple[str, ...]  # the facts stated that the help center's text given did not hold
    sources: tuple[str, ...]
    right: bool | None  # answerable: every fact, none wrong, not declined; None: unanswerable
    language_right: bool
    ttft_ms: float | None = None  # to the first shown text


def turn_grade(
    conversation: Conversation,
    n: int,
    *,
    answer: str,
    declined: bool,
    plan: AnswerPlan,
    ttft_ms: float | None = None,
) -> TurnResult:
    turn = conversation.turns[n]
    declined = declined or says_dont_know(answer)
    right = None
    if turn.expect == "answer":
        right = (
            not declined
            and all(fact_holds(fact, answer) for fact in turn.facts)
            and not any(fact_holds(wrong, answer) for wrong in turn.wrong)
        )
    return TurnResult(
        conversation=conversation.id,
        turn=n,
        set=conversation.set,
        language=conversation.language,
        question=turn.question,
        expect=turn.expect,
        answer=answer,
        declined=declined,
        invented=tuple(fact.text for fact in unsupported_facts(answer, [*plan.support, turn.question])),
        sources=tuple(source.slug for source in plan.sources),
        right=right,
        language_right=text_language(answer) in (conversation.language, None),
        ttft_ms=ttft_ms,
    )


def _rate(values: Sequence[bool]) -> float:
    return round(sum(values) / len(values), 4) if values else 0.0


@dataclass(frozen=True, slots=True)
class QualityScore:
    """Shares from 0 to 1 (`invented`: of answers that state an unsupported fact, the lower the
    better); `overall` is the mean of answered_right, declined_right and 1 - invented."""

    answered_right: float
    declined_right: float
    invented: float
    language: float
    overall: float
    questions: int
    failed: int  # turns that got no answer (an error); graded as empty answers
    sets: dict[str, dict[str, float]] = field(default_factory=dict)  # the same figures per set
    results: tuple[TurnResult, ...] = field(default=(), repr=False)

    def breakdown(self) -> dict[str, Any]:
        """The figures without the answers, as stored and shown."""
        return {
            "answered_right": self.answered_right,
            "declined_right": self.declined_right,
            "invented": self.invented,
            "language": self.language,
            "overall": self.overall,
            "questions": self.questions,
            "failed": self.failed,
            "sets": self.sets,
        }


def _figures(results: Sequence[TurnResult]) -> dict[str, float]:
    answered_right = _rate([bool(r.right) for r in results if r.expect == "answer"])
    declined_right = _rate([r.declined for r in results if r.expect == "decline"])
    invented = _rate([bool(r.invented) for r in results])
    return {
        "answered_right": answered_right,
        "declined_right": declined_right,
        "invented": invented,
        "language": _rate([r.language_right for r in results]),
        "overall": round((answered_right + declined_right + 1 - invented) / 3, 4),
        "questions": len(results),
    }


def quality_score(results: Sequence[TurnResult], *, failed: int = 0) -> QualityScore:
    figures = _figures(results)
    return QualityScore(
        answered_right=figures["answered_right"],
        declined_right=figures["declined_right"],
        invented=figures["invented"],
        language=figures["language"],
        overall=figures["overall"],
        questions=len(results),
        failed=failed,
        sets={
            name: _figures([r for r in results if r.set == name]) for name in sorted({r.set for r in results})
        },
        results=tuple(results),
    )


# --- asking -------------------------------------------------------------------------------------


class AnswerFailed(RuntimeError):
    """A question got no answer; it is graded as an empty one."""


@dataclass(frozen=True, slots=True)
class ModelAnswer:
    text: str
    declined: bool  # the worker's check found nothing of it that holds: it is the decline
    ttft_ms: float | None = None


class Answerer(Protocol):
    async def __call__(
        self, messages: list[dict[str, str]], sampling: SamplingParams, grounding: Grounding | None
    ) -> ModelAnswer: ...


def queue_answerer(*, variant: str, model: str) -> Answerer:
    """Answers from the live workers serving `variant`'s `model`, through admission and the batch
    tier's queue, so that a score never takes capacity from customers. A refusal waits as long
    as it says and tries again, within the tier's longest answer wait."""

    async def answer(
        messages: list[dict[str, str]], sampling: SamplingParams, grounding: Grounding | None
    ) -> ModelAnswer:
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
                    grounding=grounding,
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
        if isinstance(fold.end, Error) or fold.end is None:
            raise AnswerFailed(f"{fold.end.code}: {fold.end.message}" if fold.end else "no answer")
        report = fold.end.grounding
        ttft = fold.end.timings.ttft_ms if fold.end.timings else None
        return ModelAnswer(fold.text, declined=bool(report and report.declined), ttft_ms=ttft)

    return answer


async def answers_collect(
    conversations: Sequence[Conversation],
    *,
    variant: VariantSettings,
    answerer: Answerer,
    concurrency: int = 16,
    progress: Callable[[int, int], Awaitable[None] | None] | None = None,
) -> QualityScore:
    """Ask every conversation, turn by turn with its history as the chat keeps it, `concurrency`
    conversations at a time (so the engine batches them), and grade each answer. `progress(done,
    total)` is called after each turn."""
    slots = asyncio.Semaphore(concurrency)
    total = sum(len(conversation.turns) for conversation in conversations)
    done = 0
    failed = 0
    row = variant.variant()

    async def ask(conversation: Conversation) -> list[TurnResult]:
        nonlocal done, failed
        results = []
        history: list[dict[str, str]] = []
        previous_sources: list[str] = []
        async with slots:
            for n, turn in enumerate(conversation.turns):
                ttft_ms: float | None
                plan = await database_sync_to_async(answer_plan)(
                    variant=row, message=turn.question, history=history, previous_sources=previous_sources
                )
                if plan.known is not None:
                    # Shown as soon as it is planned: what planning took (not the wait for a
                    # thread, which a chat post does not share with 15 others).
                    answer, declined, ttft_ms = plan.known.text, plan.declined, plan.known.lookup_ms
                else:
                    try:
                        given = await answerer(plan.messages, row.sampling(), plan.grounding)
                        answer, declined, ttft_ms = given.text, given.declined, given.ttft_ms
                    except (AnswerFailed, TimeoutError):
                        answer, declined, ttft_ms = "", False, None
                        failed += 1
                results.append(
                    turn_grade(conversation, n, answer=answer, declined=declined, plan=plan, ttft_ms=ttft_ms)
                )
                history += [
                    {"role": "user", "content": turn.question},
                    {"role": "assistant", "content": answer},
                ]
                previous_sources = [source.slug for source in plan.sources]
                done += 1
                if progress is not None:
                    reported = progress(done, total)
                    if reported is not None:
                        await reported
        return results

    per_conversation = await asyncio.gather(*(ask(conversation) for conversation in conversations))
    return quality_score([result for results in per_conversation for result in results], failed=failed)
