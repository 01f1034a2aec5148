"""Finding what the help center says about a customer's message: in the customer's language,
with the conversation it belongs to."""

import pytest
from django.db.models import F

from knowledge import services
from knowledge.index import current_index
from knowledge.models import Article, KnowledgeBase
from knowledge.retrieval import retrieve
from knowledge.selectors import excerpts_of

pytestmark = pytest.mark.django_db


def _best(question: str, **context) -> tuple[str, str]:
    """The best sentence's article (its slug) and language."""
    found = retrieve(question=question, **context)
    article = found.index.article_of(found.ranked[0].sentence)
    return article.slug, article.language


# One test per kind rather than per question: each imports the demo help center anew.
ANSWERED = {
    "How long do I have to return an item?": ("returns-policy", "en"),
    "how much is next day delivery": ("shipping-costs", "en"),
    "do i get free shiping over 50 dollars?": ("shipping-costs", "en"),
    "Combien coûte une étiquette de retour ?": ("returns-policy-fr", "fr"),
    "¿Cuánto cuesta el envío exprés?": ("shipping-costs-es", "es"),
    "Wie lange dauert der Standardversand?": ("shipping-times-de", "de"),
    "Do you ship to Switzerland?": ("international-delivery", "en"),
}


def test_a_question_finds_the_article_that_answers_it_in_the_customers_language(help_center):
    assert {question: _best(question) for question in ANSWERED} == ANSWERED


def test_a_table_row_is_found_with_its_header(help_center):
    found = retrieve(question="What does next-day delivery cost?")
    best = found.index.sentences[found.ranked[0].sentence].text
    assert best == "| Method | Cost |\n|---|---|\n| Next-day | $24.95 |"


def test_a_follow_up_is_searched_with_the_conversation_and_in_its_language(help_center):
    follow_up = "what about for a sofa delivered by freight?"
    assert _best(follow_up)[0] != "returns-policy"  # alone: what freight delivery costs
    history = ["How much does a return label cost?"]
    assert _best(follow_up, history=history, previous_sources=["returns-policy"]) == ("returns-policy", "en")
    found = retrieve(question="et en express ?", history=["Combien coûte la livraison standard ?"])
    assert (found.language, found.follow_up) == ("fr", True)


def test_a_language_without_articles_is_answered_from_the_others(help_center):
    Article.objects.filter(language="de").update(status=Article.Status.RETIRED)
    KnowledgeBase.objects.filter(pk=1).update(version=F("version") + 1)
    current_index.forget()
    found = retrieve(question="Wie lange habe ich Zeit, einen Artikel zurückzugeben?")
    assert (found.language, found.searched_language) == ("de", "en")  # the originals' language
    assert found.index.article_of(found.ranked[0].sentence).slug.startswith("returns-policy")


def test_excerpts_for_a_model_keep_within_the_budget_and_name_each_passage_once(help_center, settings):
    found = retrieve(question="How long do I have to return an item?")
    excerpts = excerpts_of(found)
    assert 0 < sum(len(excerpt.text) for excerpt in excerpts) <= settings.KNOWLEDGE_PROMPT_MAX_CHARS
    assert len({excerpt.text for excerpt in excerpts}) == len(excerpts)
    assert excerpts[0].source.url == "/help/returns-policy"
    assert excerpts_of(found, max_chars=10) == ()


def test_a_retired_article_is_no_longer_found(help_center):
    for article in Article.objects.filter(slug__startswith="returns-policy"):
        services.article_status_set(article=article, status=Article.Status.RETIRED)
    assert _best("How long do I have to return an item?")[0] != "returns-policy"
