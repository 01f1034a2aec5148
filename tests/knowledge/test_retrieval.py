"""Finding the help center's passages for a customer's question."""

import time

import pytest
from django.db.models import F

from knowledge import selectors, services
from knowledge.index import VERSION_CHECK_S, current_index
from knowledge.models import Article, KnowledgeBase

pytestmark = pytest.mark.django_db


def _slugs(question: str) -> list[str]:
    return [source.slug for source in selectors.help_center_excerpts(question=question).sources]


# One test per kind rather than per question: each imports the demo help center anew.
ANSWERED = {
    "How long do I have to return an item?": "returns-policy",
    "Where is my refund?": "when-you-get-your-refund",
    "I forgot my password": "resetting-your-password",
    "Do you ship to Germany?": "international-delivery",
    "How do I cancel my order?": "changing-or-cancelling-an-order",
}
NOT_COVERED = ["What is the capital of France?", "Who won the world cup?", "Tell me a joke"]


def test_questions_find_the_article_that_answers_them_first_and_others_find_nothing(help_center):
    assert {question: _slugs(question)[:1] for question in ANSWERED} == {
        question: [slug] for question, slug in ANSWERED.items()
    }
    for question in NOT_COVERED:
        found = selectors.help_center_excerpts(question=question)
        assert (found.excerpts, found.sources) == ((), ()), question


def test_excerpts_keep_within_the_prompt_budget_and_name_each_source_once(help_center, settings):
    found = selectors.help_center_excerpts(question="How long do I have to return an item?")
    assert 0 < sum(len(excerpt.text) for excerpt in found.excerpts) <= settings.KNOWLEDGE_PROMPT_MAX_CHARS
    assert len(found.sources) == len(set(found.sources))
    assert found.sources[0].url == "/help/returns-policy"
    assert (
        selectors.help_center_excerpts(
            question="How long do I have to return an item?", max_chars=10
        ).excerpts
        == ()
    )


def test_a_retired_article_is_no_longer_found(help_center):
    article = Article.objects.get(slug="returns-policy")
    services.article_status_set(article=article, status=Article.Status.RETIRED)
    assert "returns-policy" not in _slugs("How long do I have to return an item?")


def test_a_change_made_by_another_process_is_searched_after_the_next_version_check():
    services.article_create(
        slug="pets", title="Pets in the shop", body="Dogs on a lead are welcome in our stores."
    )
    assert _slugs("Can I bring my dog?") == ["pets"]
    # Another process retired it: this one learns of it only through the version.
    Article.objects.filter(slug="pets").update(status=Article.Status.RETIRED)
    KnowledgeBase.objects.filter(pk=1).update(version=F("version") + 1)
    deadline = time.monotonic() + VERSION_CHECK_S + 5
    while _slugs("Can I bring my dog?") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _slugs("Can I bring my dog?") == []


def test_a_refresh_searches_a_change_made_by_another_process_at_once(django_assert_num_queries):
    """What a web process's hot-reads thread does twice a second (config.startup): the post
    after it neither reads the version nor builds the index."""
    services.article_create(
        slug="pets", title="Pets in the shop", body="Dogs on a lead are welcome in our stores."
    )
    assert _slugs("Can I bring my dog?") == ["pets"]
    Article.objects.filter(slug="pets").update(status=Article.Status.RETIRED)
    KnowledgeBase.objects.filter(pk=1).update(version=F("version") + 1)
    current_index.refresh()
    with django_assert_num_queries(0):
        assert _slugs("Can I bring my dog?") == []
