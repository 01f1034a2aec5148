"""The quality score: the question sets, what it counts as right, declined and invented, and
conversations asked turn by turn with their history, as the chat asks them."""

import asyncio

import pytest

from knowledge.answers import AnswerPlan
from knowledge.prompts import DECLINES
from knowledge.quality import (
    AnswerFailed,
    Conversation,
    ModelAnswer,
    Turn,
    VariantSettings,
    answers_collect,
    conversations_load,
    turn_grade,
)
from scheduler.models import Variant
from tests.knowledge.conftest import DEMO_HELP_CENTER

Style = Variant.AnswerStyle


def test_the_question_sets_are_what_customers_ask():
    conversations = conversations_load()
    turns = [(c, t) for c in conversations for t in c.turns]
    assert len(turns) >= 200
    assert sum(t.expect == "decline" for _, t in turns) >= 40
    assert {c.language for c in conversations} == {"en", "fr", "es", "de"}
    assert sum(len(c.turns) > 1 for c in conversations) >= 20  # follow-ups in a conversation
    assert {c.set for c in conversations} == {"tuning", "heldout", "fresh"}
    articles = {path.stem for path in DEMO_HELP_CENTER.glob("*.md")}
    for _, turn in turns:
        if turn.expect == "answer":
            assert turn.facts and set(turn.sources) <= articles, turn


PLAN = AnswerPlan(known=None, messages=[], sources=(), support=("Express shipping costs $14.95.",))
CONVERSATION = Conversation(
    id="c",
    language="en",
    turns=(
        Turn(
            "How much is express?", "answer", ("shipping-costs",), facts=(r"\$?14\.95",), wrong=(r"\$?5\.95",)
        ),
        Turn("Do you have a student discount?", "decline"),
    ),
)


def test_an_answer_is_right_with_every_fact_and_none_wrong_and_not_declined():
    assert turn_grade(CONVERSATION, 0, answer="Express costs $14.95.", declined=False, plan=PLAN).right
    assert not turn_grade(CONVERSATION, 0, answer="Express costs $14.", declined=False, plan=PLAN).right
    assert not turn_grade(CONVERSATION, 0, answer="$14.95 or $5.95.", declined=False, plan=PLAN).right
    assert not turn_grade(CONVERSATION, 0, answer="$14.95", declined=True, plan=PLAN).right


def test_a_decline_is_counted_as_such_and_a_fact_the_text_given_does_not_hold_as_invented():
    declined = turn_grade(CONVERSATION, 1, answer=DECLINES["en"], declined=True, plan=PLAN)
    assert (declined.declined, declined.right, declined.invented) == (True, None, ())
    invented = turn_grade(
        CONVERSATION, 1, answer="Students get 10% off for 2 weeks.", declined=False, plan=PLAN
    )
    assert (invented.declined, invented.invented) == (False, ("10%", "2 weeks"))
    said = turn_grade(CONVERSATION, 1, answer="Sorry, I don't know.", declined=False, plan=PLAN)
    assert said.declined  # the model said so itself


class ScriptedModel:
    """Answers each customer message with the text scripted for it, and keeps what it was
    given, as a variant's workers would be asked."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.asked: list[list[dict[str, str]]] = []

    async def __call__(self, messages, sampling, grounding) -> ModelAnswer:
        self.asked.append(messages)
        # The question ends the last message, after the help center's excerpts found for it.
        answer = self.answers[messages[-1]["content"].rpartition("Customer question: ")[2]]
        if answer is None:
            raise AnswerFailed("engine_error: failed")
        return ModelAnswer(answer, declined=False, ttft_ms=12.0)


def _settings(style: str) -> VariantSettings:
    return VariantSettings(
        name="v",
        model="m",
        system_prompt="You help.",
        temperature=0.0,
        top_p=1.0,
        max_tokens=64,
        answer_style=style,
    )


@pytest.mark.django_db
def test_a_conversation_is_asked_turn_by_turn_with_its_history_and_graded(help_center):
    conversation = Conversation(
        id="returns",
        language="en",
        turns=(
            Turn("How much does a return label cost?", "answer", ("returns-policy",), facts=(r"\$?6\.50",)),
            Turn("and for a sofa delivered by freight?", "answer", ("returns-policy",), facts=(r"\$?59",)),
            Turn("Can I pay with Afterpay?", "decline"),
        ),
    )
    model = ScriptedModel(
        {
            "How much does a return label cost?": "A return label costs $6.50.",
            "and for a sofa delivered by freight?": "It costs $99.",
        }
    )
    score = asyncio.run(answers_collect([conversation], variant=_settings(Style.GENERATED), answerer=model))
    first, second, third = score.results
    assert (first.right, second.right, second.invented, third.declined) == (True, False, ("$99",), True)
    # The second turn was asked with the first one and its answer.
    assert model.asked[1][1:3] == [
        {"role": "user", "content": "How much does a return label cost?"},
        {"role": "assistant", "content": "A return label costs $6.50."},
    ]
    assert (score.answered_right, score.declined_right, score.invented) == (0.5, 1.0, round(1 / 3, 4))
    extractive = asyncio.run(
        answers_collect([conversation], variant=_settings(Style.EXTRACTIVE), answerer=model)
    )
    assert (extractive.answered_right, extractive.invented, len(model.asked)) == (1.0, 0.0, 2)


@pytest.mark.django_db
def test_a_question_that_gets_no_answer_is_counted_as_failed(help_center):
    conversation = Conversation(
        id="c", language="en", turns=(Turn("How much is express shipping?", "answer", facts=("14",)),)
    )
    model = ScriptedModel({"How much is express shipping?": None})
    score = asyncio.run(answers_collect([conversation], variant=_settings(Style.VERIFIED), answerer=model))
    assert (score.failed, score.answered_right) == (1, 0.0)
