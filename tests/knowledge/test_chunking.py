"""Articles are cut into passages by section, then paragraph, then sentence."""

from knowledge.chunking import CHUNK_MAX_CHARS, ChunkText, article_chunks, passage_sentences


def test_each_section_is_a_passage_under_its_heading():
    body = (
        "Intro line.\n\n## Standard delivery\n\n3 to 5 days.\n\nFree over $50.\n\n## Express\n\n1 to 2 days."
    )
    assert article_chunks(body) == [
        ChunkText("", "Intro line."),
        ChunkText("Standard delivery", "3 to 5 days.\n\nFree over $50."),
        ChunkText("Express", "1 to 2 days."),
    ]


def test_long_sections_are_cut_between_paragraphs_and_sentences_within_the_size():
    sentence = "Refunds reach your card within five to ten business days of our check. "
    body = "## Refunds\n\n" + sentence * 20 + "\n\n" + "Short paragraph."
    chunks = article_chunks(body)
    assert len(chunks) > 2
    assert all(len(chunk.text) <= CHUNK_MAX_CHARS for chunk in chunks)
    assert all(chunk.heading == "Refunds" for chunk in chunks)
    assert all(chunk.text.endswith((".", "days")) for chunk in chunks)
    # Nothing is lost: every sentence is in some passage.
    assert sum(chunk.text.count("Refunds reach") for chunk in chunks) == 20


def test_a_word_longer_than_a_passage_is_still_cut():
    chunks = article_chunks("x" * (CHUNK_MAX_CHARS * 2 + 10))
    assert [len(chunk.text) for chunk in chunks] == [CHUNK_MAX_CHARS, CHUNK_MAX_CHARS, 10]


def test_what_is_embedded_names_the_article_and_the_section():
    chunk = ChunkText("Express", "1 to 2 days.")
    assert chunk.embedding_input("Shipping times") == "Shipping times\nExpress\n1 to 2 days."


TABLE = "| Method | Cost |\n|---|---|\n| Standard | $5.95 |\n| Express | $14.95 |"


def test_a_table_is_a_passage_of_its_own_and_each_row_a_sentence_under_its_header():
    [intro, table, after] = article_chunks(
        f"Shipping is charged per order.\n\n{TABLE}\n\nGift cards do not count."
    )
    assert (intro.text, table.text, after.text) == (
        "Shipping is charged per order.",
        TABLE,
        "Gift cards do not count.",
    )
    assert passage_sentences(table.text) == [
        "| Method | Cost |\n|---|---|\n| Standard | $5.95 |",
        "| Method | Cost |\n|---|---|\n| Express | $14.95 |",
    ]


def test_a_long_table_is_cut_between_rows_each_piece_under_the_header():
    rows = "\n".join(f"| Item {i} | ${i}.95 |" for i in range(60))
    chunks = article_chunks(f"| Item | Price |\n|---|---|\n{rows}")
    assert len(chunks) > 1
    assert all(chunk.text.startswith("| Item | Price |\n|---|---|\n") for chunk in chunks)
    assert sum(chunk.text.count("| Item ") for chunk in chunks) == 60 + len(chunks)


def test_each_list_item_keeps_the_sentence_that_introduces_its_list():
    text = (
        "Every product has a warranty:\n\n- **Furniture:** 2 years.\n- **Cookware:** 5 years.\n\n"
        "Wear is not covered."
    )
    assert passage_sentences(text) == [
        "Every product has a warranty:\n- **Furniture:** 2 years.",
        "Every product has a warranty:\n- **Cookware:** 5 years.",
        "Wear is not covered.",
    ]


def test_a_full_stop_inside_a_price_does_not_end_a_sentence():
    assert passage_sentences("Standard costs $5.95 per order. Express is faster.") == [
        "Standard costs $5.95 per order.",
        "Express is faster.",
    ]
