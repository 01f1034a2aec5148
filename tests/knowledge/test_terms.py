"""The lexical terms retrieval matches: grammar left out, stems, and typos mended to the help
center's own word."""

from knowledge.terms import Lexicon, coverage, terms


def test_the_terms_of_a_question_leave_out_how_it_is_asked():
    assert terms("How long do I have to return the items?") == ["return", "item"]


def test_a_typo_one_letter_off_is_mended_to_the_help_centers_word_and_a_short_word_is_not():
    lexicon = Lexicon.build([set(terms("Shipping costs and returns")), set(terms("Pillows and duvets"))])
    assert lexicon.question_terms("do i get free shiping for a pilow") == ["free", "shipp", "pillow"]
    assert lexicon.question_terms("cots") == ["cots"]  # four letters: not mended


def test_coverage_weighs_rare_terms_more():
    lexicon = Lexicon.build(
        [set(terms("Klarna instalments order")), set(terms("order returns")), set(terms("order"))]
    )
    asked = lexicon.question_terms("order with Klarna")
    assert coverage(asked, set(terms("Klarna")), lexicon) > coverage(asked, set(terms("order")), lexicon)


def test_every_form_of_a_word_meets_at_one_stem():
    assert terms("backorder") == terms("backorders") == terms("backordered") == ["backord"]
