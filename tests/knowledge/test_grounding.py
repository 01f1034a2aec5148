"""The check of a verified answer, sentence by sentence, against the help center's sentences it
was given: what holds is shown, a sentence that fails is replaced by the help center's own or
left out, an answer of which nothing holds becomes the decline."""

import pytest

from knowledge.grounding import AnswerChecker, SourceCheck
from scheduler.generation import Grounding, GroundingReport, GroundingSource

WARRANTY_LEAD = (
    "Every Larkspur Home product has a warranty against manufacturing defects from the date of delivery:"
)
WARRANTY = GroundingSource(
    "warranty",
    "Warranty",
    (
        f"{WARRANTY_LEAD}\n- **Furniture, lighting and small appliances:** 2 years.",
        f"{WARRANTY_LEAD}\n- **Cookware:** 5 years; cast-iron pans for life.",
    ),
)
NOT_RETURNABLE = GroundingSource(
    "items-that-cannot-be-returned",
    "Items that cannot be returned",
    (
        "For hygiene or because they are made for you, these items cannot be returned unless they "
        "arrived damaged or defective:\n"
        "- pillows, duvets and mattress protectors once their sealed wrapping is opened;",
    ),
)
NEXT_DAY = GroundingSource(
    "shipping-times",
    "Shipping times",
    (
        "- **Next-day shipping:** the next business day, for orders placed before 2 pm Eastern Time. "
        "Not available to Alaska, Hawaii or P.O. boxes.",
    ),
)
KLARNA = GroundingSource(
    "paying-in-instalments",
    "Paying in instalments with Klarna",
    ("Orders from $35 to $1,000 can be paid in 4 interest-free instalments with Klarna.",),
)


def _grounding(question: str = "What does the warranty cover?", language: str = "en") -> Grounding:
    return Grounding(
        question=question,
        language=language,
        sources=(WARRANTY, NOT_RETURNABLE, NEXT_DAY, KLARNA),
        decline="DECLINE",
    )


@pytest.mark.parametrize(
    ("sentence", "reason"),
    [
        ("The maximum amount you can pay with Klarna is $100.", "fact"),
        ("The warranty for a cast-iron skillet is 2 years.", "fact"),  # 2 years is furniture's
        ("We have a 10% military discount.", "fact"),
        ("Yes, you can get next-day delivery in Anchorage, Alaska.", "name"),
        ("Yes, you can return opened pillows.", "contradiction"),
        ("Our team answers on a dedicated hotline around the clock for every customer.", "unrelated"),
    ],
)
def test_what_customers_were_told_wrongly_fails_the_check(sentence, reason):
    verdict = SourceCheck(_grounding()).check(sentence)
    assert (verdict.supported, verdict.reason) == (False, reason)


@pytest.mark.parametrize(
    "sentence",
    [
        "Orders of up to $1,000 can be paid with Klarna in 4 instalments.",
        "Cast-iron pans are covered for life.",
        "Pillows cannot be returned once their wrapping is opened.",
        "Next-day shipping is not available to Alaska.",
        "I hope this helps!",
    ],
)
def test_what_the_help_center_says_holds(sentence):
    assert SourceCheck(_grounding()).check(sentence).supported


def test_a_fact_the_customer_wrote_holds():
    check = SourceCheck(_grounding(question="I paid $30 for a lamp, can I pay it in instalments?"))
    assert check.check("Klarna takes orders from $35, and yours is $30.").supported


def test_a_german_noun_is_not_taken_for_an_unknown_name():
    check = SourceCheck(_grounding(language="de"))
    assert check.check("Die Garantie für Kochgeschirr beträgt 5 Jahre.").supported is not None
    assert (
        SourceCheck(_grounding(language="de")).check("Eine Lieferung nach Anchorage ist möglich.").reason
        != "name"
    )


def test_sentences_are_shown_once_whole_and_checked():
    checker = AnswerChecker(_grounding())
    assert checker.feed("Cast-iron pans are ") == ""  # not a whole sentence yet
    assert checker.feed("covered for life. The maximum") == "Cast-iron pans are covered for life. "
    assert checker.feed(" you can pay with Klarna is $100. ") == KLARNA.sentences[0] + " "
    assert checker.report().checked == 2


def test_a_failed_sentence_is_replaced_by_the_help_centers_own_and_quoted_once():
    checker = AnswerChecker(_grounding())
    shown = checker.feed("The maximum you can pay with Klarna is $100. Klarna takes at most $100. ")
    assert shown == KLARNA.sentences[0] + " "  # replaced once, then the second failure is left out
    assert checker.finish(cut_off=False) == ""
    assert checker.report() == GroundingReport(style="verified", checked=2, replaced=1, dropped=1)


def test_a_sentence_cut_off_by_the_length_limit_is_not_shown():
    checker = AnswerChecker(_grounding())
    checker.feed("Cast-iron pans are covered for life. Cookware is covered for")
    assert checker.finish(cut_off=True) == ""
    checker = AnswerChecker(_grounding())
    checker.feed("Cast-iron pans are covered for life. Cookware is covered for 5 years")
    assert checker.finish(cut_off=False) == "Cookware is covered for 5 years"


def test_an_answer_of_which_nothing_holds_is_the_decline():
    checker = AnswerChecker(_grounding())
    assert checker.feed("We have a 10% military discount code for veterans across every state. ") == ""
    assert checker.finish(cut_off=False) == "DECLINE"
    assert checker.report().declined == "unsupported"
