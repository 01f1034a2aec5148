"""Extractive answers quote the help center's own sentences, as the article shows them."""

import pytest

from knowledge.extractive import extract
from knowledge.facts import unsupported_facts
from knowledge.retrieval import retrieve

pytestmark = pytest.mark.django_db


def test_an_answer_quotes_the_sentences_that_answer_in_the_customers_language(help_center):
    english = extract(retrieve(question="How long do I have to return an item?"))
    assert "30 days" in english.text
    assert english.sources[0].slug == "returns-policy"
    french = extract(retrieve(question="Combien de temps ai-je pour retourner un article ?"))
    assert "30 jours" in french.text and french.sources[0].language == "fr"


def test_a_table_row_is_quoted_under_its_header_and_a_list_item_under_its_introduction(help_center):
    cost = extract(retrieve(question="What does next-day delivery cost?"))
    assert "| Method | Cost |\n|---|---|\n" in cost.text and "| Next-day | $24.95 |" in cost.text
    warranty = extract(retrieve(question="What is the warranty on a cast-iron pan?"))
    assert "from the date of delivery:\n- **Cookware:** 5 years; cast-iron pans for life." in warranty.text


def test_an_answer_states_nothing_its_sentences_do_not(help_center):
    for question in (
        "How much is express shipping?",
        "Can I pay with Klarna?",
        "Wie lange dauert der Standardversand?",
    ):
        extracted = extract(retrieve(question=question))
        assert unsupported_facts(extracted.text, list(extracted.sentences)) == [], question


def test_a_quote_in_another_language_says_so(help_center):
    from django.db.models import F

    from knowledge.index import current_index
    from knowledge.models import Article, KnowledgeBase

    Article.objects.filter(language="es").update(status=Article.Status.RETIRED)
    KnowledgeBase.objects.filter(pk=1).update(version=F("version") + 1)
    current_index.forget()
    extracted = extract(retrieve(question="¿Cuánto tiempo tengo para devolver un artículo?"))
    assert extracted.text.startswith("Nuestro centro de ayuda lo explica en otro idioma:")


def test_a_sentence_stating_a_figure_is_quoted_before_nearer_ones_that_state_none(help_center):
    # The article's nearest sentences give the reasons for a decline; the one a customer with a
    # pending charge needs is the hold's delay.
    extracted = extract(
        retrieve(question="My card was declined but now there's a pending charge on my bank account?!")
    )
    assert "3 to 5 business days" in extracted.text
