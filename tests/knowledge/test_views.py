"""The public help pages render an article's Markdown, safely."""

import pytest
from django.test import Client

from knowledge import services
from knowledge.models import Article

pytestmark = pytest.mark.django_db


def test_an_article_page_renders_its_markdown():
    services.article_create(
        slug="shipping-costs",
        title="Shipping costs",
        body="## Standard\n\n**$5.95**, free over $50.\n\n- one\n- two",
    )
    response = Client().get("/help/shipping-costs")
    assert response.status_code == 200
    html = response.content.decode()
    assert "<h1>Shipping costs</h1>" in html
    assert "<h2>Standard</h2>" in html
    assert "<strong>$5.95</strong>" in html
    assert "<li>one</li>" in html
    assert 'href="/help/shipping-costs"' in Client().get("/help/").content.decode()


def test_html_and_script_links_in_an_article_show_as_text():
    services.article_create(
        slug="tricky",
        title="Tricky <b>title</b>",
        body='<script>alert(1)</script>\n\n[click](javascript:alert(1)) <img src=x onerror="alert(1)">',
    )
    html = Client().get("/help/tricky").content.decode()
    assert "<script>alert(1)" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'href="javascript:' not in html
    assert "<img" not in html
    assert "Tricky &lt;b&gt;title&lt;/b&gt;" in html


def test_retired_and_unknown_articles_are_not_found():
    article = services.article_create(slug="old", title="Old", body="Old policy.")
    services.article_status_set(article=article, status=Article.Status.RETIRED)
    assert Client().get("/help/old").status_code == 404
    assert Client().get("/help/never-was").status_code == 404
    assert "/help/old" not in Client().get("/help/").content.decode()


def test_an_article_that_moves_keeps_its_old_addresses_for_earlier_links():
    """Answers store the address of the article they quoted; moving it must not break them."""
    article = services.article_create(slug="returns-policy", title="Returns", body="30 days.")
    for slug in ("returns", "returns-and-refunds"):
        services.article_update(article=article, title=article.title, body=article.body, slug=slug)

    for old in ("returns-policy", "returns"):
        response = Client().get(f"/help/{old}")
        assert (response.status_code, response["Location"]) == (301, "/help/returns-and-refunds")
    assert "<h1>Returns</h1>" in Client().get("/help/returns-policy", follow=True).content.decode()

    services.article_status_set(article=article, status=Article.Status.RETIRED)
    assert Client().get("/help/returns-policy").status_code == 404
