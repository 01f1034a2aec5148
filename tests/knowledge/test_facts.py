"""The facts of a sentence, normalised so that one fact written two ways is equal, in English,
French, Spanish and German; and which of them a text does not hold."""

import pytest

from knowledge.facts import facts, negated, unsupported_facts


def _values(text: str) -> list[tuple[str, str]]:
    return [(fact.kind, fact.value) for fact in facts(text)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Orders from $35 to $1,000 can be paid with Klarna.",
            [("amount", "35"), ("amount", "1000"), ("name", "klarna")],
        ),
        ("Les commandes de 35 $ à 1 000 $ peuvent être payées.", [("amount", "35"), ("amount", "1000")]),
        ("Standard costs $5.95.", [("amount", "5.95")]),
        ("Le code offre 10 % de réduction.", [("percent", "10")]),
        ("Sie erhalten 10 Prozent zurück.", [("percent", "10")]),
        ("You have two weeks.", [("duration", "14 day")]),
        ("Vous avez 30 jours.", [("duration", "30 day")]),
        ("Tarda de 3 a 5 días hábiles.", [("duration", "3-5 business-day")]),
        ("Das dauert 3 bis 5 Werktage.", [("duration", "3-5 business-day")]),
        ("Cookware: 5 years.", [("duration", "60 month")]),
        (
            "Write to help@larkspurhome.example or call 1-800-555-0142.",
            [("email", "help@larkspurhome.example"), ("phone", "8005550142")],
        ),
        ("See https://larkspurhome.example/returns.", [("link", "larkspurhome.example/returns")]),
        ("Pay in 4 instalments.", [("number", "4")]),
    ],
)
def test_facts_are_found_and_normalised_in_each_language(text, expected):
    assert _values(text) == expected


def test_a_capital_that_starts_a_sentence_or_a_common_word_is_no_name():
    assert _values("Returns are free. You can return it. I'd rather not guess.") == []


def test_the_same_fact_written_another_way_is_supported_and_a_different_one_is_not():
    sources = ["You can return most items within 14 days of delivery.", "Klarna: orders up to $1,000."]
    assert unsupported_facts("You have two weeks to return it, up to 1000 dollars.", sources) == []
    invented = unsupported_facts("You have 30 days, and the maximum is $100.", sources)
    assert [(fact.kind, fact.value) for fact in invented] == [("duration", "30 day"), ("amount", "100")]


def test_a_range_supports_each_of_its_ends():
    assert unsupported_facts("Standard takes 5 business days.", ["Standard: 3 to 5 business days."]) == []


def test_names_are_checked_only_when_asked_for():
    assert unsupported_facts("Pay with Afterpay.", ["Pay with Klarna."]) == []
    [fact] = unsupported_facts("Pay with Afterpay.", ["Pay with Klarna."], kinds=frozenset({"name"}))
    assert fact.text == "Afterpay"


@pytest.mark.parametrize(
    "text",
    [
        "Gift cards cannot be returned.",
        "Les cartes cadeaux ne sont pas remboursables.",
        "No se puede devolver.",
        "Das ist nicht möglich.",
    ],
)
def test_negations_are_seen_in_each_language(text):
    assert negated(text)
    assert not negated("Gift cards can be returned within 30 days.")
