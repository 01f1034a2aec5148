"""The quality score: what it counts as right, graded on answers from a scripted answerer."""

import asyncio

import pytest

from knowledge.language import text_language
from knowledge.prompts import HELP_CENTER_PROMPT, UNKNOWN_REPLIES
from knowledge.quality import (
    AnswerFailed,
    QualityQuestion,
    VariantSettings,
    answers_collect,
    quality_prompts,
    quality_questions,
    repeats_itself,
    says_dont_know,
)
from scheduler.generation import SamplingParams
from tests.quality_questions import CAPITAL, RETURNS, RETURNS_FR


class ScriptedAnswerer:
    """Answers each customer message with the text scripted for it, and keeps what it was asked
    (the messages and the sampling), as a variant's workers would be asked."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.requests: list[tuple[list[dict[str, str]], SamplingParams]] = []

    async def __call__(self, messages: list[dict[str, str]], sampling: SamplingParams) -> str:
        self.requests.append((messages, sampling))
        return self.answers[messages[-1]["content"]]


def _variant(**changes) -> VariantSettings:
    return VariantSettings(
        **{
            "name": "stable",
            "assistant_prompt": "You are the shop's assistant.",
            "temperature": 0.0,
            "top_p": 1.0,
            "max_tokens": 64,
            **changes,
        }
    )


def _score(answerer: ScriptedAnswerer, questions: list[QualityQuestion], variant: VariantSettings):
    prompts = quality_prompts(variant=variant, questions=questions)
    return asyncio.run(answers_collect(prompts, variant=variant, answerer=answerer))


def test_the_question_set_covers_paraphrases_unanswerable_questions_and_other_languages():
    questions = quality_questions()
    assert len(questions) >= 60
    assert len({q.id for q in questions}) == len(questions)
    assert sum(q.unanswerable for q in questions) >= 8
    assert {q.language for q in questions} >= {"en", "fr", "es", "de"}
    assert all(q.unanswerable or (q.source and q.facts) for q in questions)


def test_the_question_set_names_only_articles_of_the_demo_help_center():
    from tests.knowledge.conftest import DEMO_HELP_CENTER

    slugs = {path.stem for path in DEMO_HELP_CENTER.glob("*.md")}
    assert {q.source for q in quality_questions() if not q.unanswerable} <= slugs


def test_right_answers_score_full_marks_from_the_help_centers_prompt(help_center):
    engine = ScriptedAnswerer(
        {
            RETURNS.question: "You can return most items within 30 days of delivery.",
            CAPITAL.question: "I'm sorry, I don't know: our help center has nothing on that.",
        }
    )
    score = _score(engine, [RETURNS, CAPITAL], _variant(temperature=0.3, unknown_reply=False))
    assert (score.facts, score.sources, score.dont_know, score.language, score.readable) == (1, 1, 1, 1, 1)
    assert score.overall == 1
    # Asked as the chat asks: the variant's prompt and sampling, the help center's excerpts.
    messages, sampling = next(r for r in engine.requests if r[0][-1]["content"] == RETURNS.question)
    system = messages[0]["content"]
    assert system.startswith("You are the shop's assistant.")
    assert HELP_CENTER_PROMPT.split("{excerpts}")[0].strip() in system
    assert "30 days of delivery" in system
    assert (sampling.temperature, sampling.top_p, sampling.max_tokens) == (0.3, 1.0, 64)


def test_a_missing_fact_an_invented_answer_and_the_wrong_language_each_cost_their_part(help_center):
    engine = ScriptedAnswerer(
        {
            RETURNS.question: "You can return items within two weeks.",
            RETURNS_FR.question: "You have 30 jours to return it.",
            CAPITAL.question: "The capital of France is Paris.",
        }
    )
    score = _score(engine, [RETURNS, RETURNS_FR, CAPITAL], _variant(unknown_reply=False))
    assert score.facts == 0.5  # the French answer has its fact, in the wrong language
    assert score.dont_know == 0
    assert score.language == pytest.approx(2 / 3, abs=1e-4)
    # The English embedding model finds the article for the English question only.
    assert score.sources == 0.5
    by_id = {result.id: result for result in score.results}
    assert (by_id["returns"].facts_found, by_id["returns-fr"].language_right) == (0, False)


def test_without_the_help_center_no_article_is_quoted_and_the_prompt_is_the_variants_alone(help_center):
    engine = ScriptedAnswerer({RETURNS.question: "Within 30 days."})
    score = _score(engine, [RETURNS], _variant(use_help_center=False))
    assert (score.facts, score.sources) == (1, 0)
    assert engine.requests[0][0][0] == {"role": "system", "content": "You are the shop's assistant."}


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("You can return most items within 30 days, and we refund the price.", "en"),
        ("Vous pouvez retourner la plupart des articles dans les 30 jours.", "fr"),
        ("Puede devolver la mayoría de los artículos en un plazo de 30 días.", "es"),
        ("Sie können die meisten Artikel innerhalb von 30 Tagen zurückgeben.", "de"),
        ("30", None),
    ],
)
def test_the_answers_language_is_told_from_its_common_words(text, language):
    assert text_language(text) == language


def test_a_question_left_unanswered_counts_as_failed_and_as_a_wrong_answer(help_center):
    async def failing(messages, sampling):
        raise AnswerFailed("engine_error: the engine died")

    variant = _variant(unknown_reply=False)
    prompts = quality_prompts(variant=variant, questions=[RETURNS, CAPITAL])
    score = asyncio.run(answers_collect(prompts, variant=variant, answerer=failing))
    assert (score.failed, score.questions, score.facts, score.dont_know) == (2, 2, 0, 0)


def test_an_answer_that_repeats_a_sentence_is_not_readable(help_center):
    looping = "You can return an item within 30 days. " * 3
    engine = ScriptedAnswerer({RETURNS.question: looping})
    score = _score(engine, [RETURNS], _variant())
    assert (score.facts, score.readable) == (1, 0)
    assert score.overall == pytest.approx((1 + 1 + 0 + 1 + 0) / 5, abs=1e-4)
    assert not repeats_itself("Returns are free. Refunds take 5 days. Returns are free of charge.")


def test_a_question_the_help_center_has_nothing_on_gets_its_reply_without_the_model(help_center):
    engine = ScriptedAnswerer({})  # never asked
    score = _score(engine, [CAPITAL], _variant())
    assert engine.requests == []
    [result] = score.results
    assert result.answer == UNKNOWN_REPLIES["en"]
    assert (score.dont_know, score.language, score.readable) == (1, 1, 1)


@pytest.mark.parametrize("language", sorted(UNKNOWN_REPLIES))
def test_the_unknown_reply_says_so_in_its_own_language(language):
    reply = UNKNOWN_REPLIES[language]
    assert says_dont_know(reply)
    assert text_language(reply) == language
    assert not repeats_itself(reply)
