"""Articles are cut into passages by section, then paragraph, then sentence."""

from knowledge.chunking import CHUNK_MAX_CHARS, ChunkText, article_chunks


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
