"""The retrieval index follows the help center: an edit made in another process is searched
after the next version check, or at once after a refresh; an empty help center is not searched."""

import time

import pytest
from django.db.models import F

from knowledge import services
from knowledge.index import VERSION_CHECK_S, current_index
from knowledge.models import Article, KnowledgeBase
from knowledge.retrieval import retrieve

pytestmark = pytest.mark.django_db


def _slugs(question: str) -> list[str]:
    found = retrieve(question=question)
    return list(dict.fromkeys(found.index.article_of(r.sentence).slug for r in found.ranked)) if found else []


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


def test_nothing_to_search_without_articles():
    assert retrieve(question="How long do I have to return an item?") is None
