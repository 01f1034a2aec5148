"""The quality benchmark's answers through the result cache (bench.answering), from a scripted
engine: what a customer who asks after another is served."""

import asyncio
from collections.abc import AsyncIterator

import pytest

from bench.answering import cache_rounds, cached_answers_collect
from inference.engines.base import Delta, GenerationRequest
from knowledge import cache as answer_cache
from knowledge.prompts import UNKNOWN_REPLIES
from knowledge.quality import quality_questions
from scheduler.models import Generation, Variant
from tests.quality_questions import CAPITAL, RETURNS, RETURNS_AGAIN


class ScriptedEngine:
    """Answers each customer message with the text scripted for it, in two deltas, and keeps
    the requests it was sent."""

    label = "scripted"
    max_num_seqs = 4

    def __init__(self, answers: dict[str, str], finish_reason: str = "stop") -> None:
        self.answers = answers
        self.finish_reason = finish_reason
        self.requests: list[GenerationRequest] = []

    def generate(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        self.requests.append(request)
        return self._deltas(self.answers[request.messages[-1]["content"]])

    async def _deltas(self, text: str) -> AsyncIterator[Delta]:
        half = len(text) // 2
        yield Delta(text=text[:half], output_tokens=1, prompt_tokens=10)
        yield Delta(text=text[half:], output_tokens=2, prompt_tokens=10, finish_reason=self.finish_reason)


@pytest.fixture
def cache_forgotten():
    answer_cache._index.forget()
    yield
    answer_cache._index.forget()


def test_each_question_is_asked_after_every_earlier_one_on_its_article_then_again():
    questions = quality_questions()
    rounds = cache_rounds(questions)
    *first_askings, again = rounds
    assert sorted(q.id for round_ in first_askings for q in round_) == sorted(q.id for q in questions)
    assert [q.id for q in again] == [f"{q.id}#again" for q in questions]
    assert [q.question for q in again] == [q.question for q in questions]
    round_of = {q.id: n for n, round_ in enumerate(first_askings) for q in round_}
    for i, question in enumerate(questions):
        earlier = [q for q in questions[:i] if q.source == question.source]
        assert all(round_of[q.id] < round_of[question.id] for q in earlier)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("variants", "cache_forgotten")
def test_a_rewording_and_a_repeat_asked_later_are_served_the_answer_the_model_wrote(help_center):
    engine = ScriptedEngine({RETURNS.question: "You can return most items within 30 days of delivery."})
    run = asyncio.run(
        cached_answers_collect(
            [RETURNS, RETURNS_AGAIN, CAPITAL], variant=Variant.objects.get(name="stable"), engine=engine
        )
    )
    assert [r.messages[-1]["content"] for r in engine.requests] == [RETURNS.question]
    assert run.served == {"returns-again": "exact", "returns#again": "exact", "returns-again#again": "exact"}
    by_id = {result.id: result for result in run.score.results}
    assert by_id["returns-again"].answer == by_id["returns"].answer
    # Under a served answer, the articles it was written from.
    assert set(by_id["returns-again"].sources) == set(by_id["returns"].sources)
    # The help center has nothing on the capital of France: its reply, not the model's, not cached.
    assert by_id["capital"].answer == by_id["capital#again"].answer == UNKNOWN_REPLIES["en"]
    assert run.hit_rate == pytest.approx(3 / 6, abs=1e-4)
    assert (run.score.facts, run.score.sources, run.score.dont_know) == (1, 1, 1)
    # The miss was recorded as the chat records it: a cache miss, finished by the model.
    assert [(g.cache, g.status, g.finish_reason) for g in Generation.objects.all()] == [
        ("miss", "done", "stop")
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("variants", "cache_forgotten")
def test_an_answer_cut_at_its_token_limit_is_never_served(help_center):
    engine = ScriptedEngine(
        {q.question: "You can return most items within" for q in (RETURNS, RETURNS_AGAIN)}, "length"
    )
    run = asyncio.run(
        cached_answers_collect(
            [RETURNS, RETURNS_AGAIN], variant=Variant.objects.get(name="stable"), engine=engine
        )
    )
    assert (len(engine.requests), run.served, run.hit_rate) == (4, {}, 0)
