"""How a chat message is answered, per answer style: what is known without a model, what a
model is given, and the decline and the greeting every style shares."""

import itertools

import pytest

from knowledge.answers import answer_plan
from knowledge.embedding import EmbedderUnavailable
from knowledge.prompts import DECLINES, GREETINGS, HELP_CENTER_PROMPT
from scheduler.models import Variant

pytestmark = pytest.mark.django_db

Style = Variant.AnswerStyle


def _variant(style: str, **fields) -> Variant:
    return Variant(
        name=f"v-{style}",
        model="m",
        system_prompt="You are a shop assistant.",
        temperature=0.0,
        top_p=1.0,
        max_tokens=128,
        answer_style=style,
        **fields,
    )


def test_an_extractive_answer_is_known_without_a_model_and_quotes_its_sources(help_center):
    plan = answer_plan(variant=_variant(Style.EXTRACTIVE), message="How long do I have to return an item?")
    assert plan.messages == [] and plan.grounding is None
    assert "30 days" in plan.known.text
    assert plan.known.grounding.style == "extractive" and plan.known.grounding.checked >= 1
    assert plan.sources[0].slug == "returns-policy"
    assert set(plan.support) >= {s for s in plan.support if "30 days" in s}


@pytest.mark.parametrize("style", [Style.GENERATED, Style.VERIFIED])
def test_a_model_answer_is_asked_from_the_excerpts_and_a_verified_one_carries_its_check(help_center, style):
    plan = answer_plan(variant=_variant(style), message="How much is express shipping?")
    assert plan.known is None
    system, question = plan.messages[0], plan.messages[-1]
    assert system == {"role": "system", "content": f"You are a shop assistant.\n\n{HELP_CENTER_PROMPT}"}
    # The excerpts come with the question they were found for, after the conversation.
    assert question["role"] == "user" and "$14.95" in question["content"]
    assert question["content"].endswith("\n\nCustomer question: How much is express shipping?")
    if style == Style.VERIFIED:
        assert plan.grounding.language == "en" and plan.grounding.decline == DECLINES["en"]
        assert any("$14.95" in sentence for source in plan.grounding.sources for sentence in source.sentences)
    else:
        assert plan.grounding is None


@pytest.mark.parametrize("style", list(Style))
def test_every_style_declines_what_the_help_center_does_not_answer_in_the_customers_language(
    help_center, style
):
    plan = answer_plan(variant=_variant(style), message="Avez-vous une réduction pour les étudiants ?")
    assert plan.known.text == DECLINES["fr"]
    assert plan.declined and plan.known.grounding.declined == "not_covered"


def test_a_greeting_is_greeted_back(help_center):
    plan = answer_plan(variant=_variant(Style.EXTRACTIVE), message="Hallo!")
    assert plan.known.text == GREETINGS["de"] and not plan.declined


def test_a_follow_up_is_answered_with_its_conversation(help_center):
    history = [
        {"role": "user", "content": "How much does a return label cost?"},
        {"role": "assistant", "content": "A prepaid return label costs $6.50."},
    ]
    plan = answer_plan(
        variant=_variant(Style.EXTRACTIVE),
        message="what about for a sofa delivered by freight?",
        history=history,
        previous_sources=["returns-policy"],
    )
    assert "$59" in plan.known.text
    verified = answer_plan(variant=_variant(Style.VERIFIED), message="and for a sofa?", history=history)
    assert verified.messages[1:3] == history  # the model reads the conversation too


def test_a_turns_prompt_starts_with_the_whole_of_the_previous_turns_prompt_and_answer(help_center):
    variant = _variant(Style.GENERATED)
    history: list[dict[str, str]] = []
    prompts = []
    for question in (
        "How much does a return label cost?",
        "How much is express shipping?",
        "Can I pay with PayPal?",
    ):
        messages = answer_plan(variant=variant, message=question, history=history).messages
        prompts.append(messages)
        answer = {"role": "assistant", "content": f"An answer to: {question}"}
        history += [{"role": "user", "content": question}, answer]
        # Each question brings other excerpts: they stay with it, never in the history.
        assert messages[-1]["content"].endswith(question) and messages[-1]["content"] != question
    for previous, following in itertools.pairwise(prompts):
        assert following[: len(previous) - 1] == previous[:-1]
        assert (
            following[len(previous) - 1]["content"]
            == previous[-1]["content"].rpartition("Customer question: ")[2]
        )


def test_without_its_embedding_model_the_help_center_declines_rather_than_guess(help_center, monkeypatch):
    def unavailable(**kwargs):
        raise EmbedderUnavailable("not installed")

    monkeypatch.setattr("knowledge.answers.retrieve", unavailable)
    plan = answer_plan(variant=_variant(Style.VERIFIED), message="How long do I have to return an item?")
    assert plan.known.text == DECLINES["en"]
