"""Articles -> passages small enough to quote in a prompt, and passages -> the sentences an
answer can be built from.

A passage is a section (the text under a Markdown heading), split at paragraphs, then at
sentences, into pieces of at most CHUNK_MAX_CHARS; a table is cut between rows, each piece
under the table's header. What is embedded carries the article's title and the section's
heading, so "How long does it take?" under "Standard delivery" in "Shipping" still reads as a
shipping question.

A passage's sentences (`passage_sentences`) are what extractive answers quote and what the
grounding check compares an answer with: each sentence of a paragraph; each item of a list
with the line that introduces the list ("These items cannot be returned:" + "gift cards;"), so
that the item keeps its meaning alone; each row of a table with the table's header.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CHUNK_MAX_CHARS = 500

_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[^\s])")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+")
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)*\|?\s*$")


@dataclass(frozen=True, slots=True)
class ChunkText:
    heading: str
    text: str

    def embedding_input(self, title: str) -> str:
        return "\n".join(part for part in (title, self.heading, self.text) if part)


def _is_table(paragraph: str) -> bool:
    lines = paragraph.splitlines()
    return len(lines) >= 2 and lines[0].lstrip().startswith("|") and bool(_TABLE_RULE.match(lines[1]))


def _sections(body: str) -> list[tuple[str, list[str]]]:
    """(heading, paragraphs) in order; the text before the first heading has heading ""."""
    sections: list[tuple[str, list[str]]] = [("", [])]
    paragraph: list[str] = []

    def close_paragraph() -> None:
        if paragraph:
            sections[-1][1].append("\n".join(paragraph))
            paragraph.clear()

    for line in body.splitlines():
        heading = _HEADING.match(line)
        if heading:
            close_paragraph()
            sections.append((heading.group(2), []))
        elif line.strip():
            # A table starts a paragraph of its own, and ends at the first line that is not a row.
            in_table = bool(paragraph) and paragraph[0].lstrip().startswith("|")
            if paragraph and line.lstrip().startswith("|") != in_table:
                close_paragraph()
            paragraph.append(line.rstrip())
        else:
            close_paragraph()
    close_paragraph()
    return [(heading, paragraphs) for heading, paragraphs in sections if paragraphs]


def _table_pieces(table: str) -> list[str]:
    """A table longer than CHUNK_MAX_CHARS, cut between rows, each piece under the header."""
    header, rule, *rows = table.splitlines()
    pieces: list[str] = []
    current: list[str] = []
    for row in rows:
        if current and len("\n".join([header, rule, *current, row])) > CHUNK_MAX_CHARS:
            pieces.append("\n".join([header, rule, *current]))
            current = []
        current.append(row)
    pieces.append("\n".join([header, rule, *current]))
    return pieces


def _pieces(paragraph: str) -> list[str]:
    """A paragraph longer than CHUNK_MAX_CHARS, cut between sentences (or words, if it must)."""
    if len(paragraph) <= CHUNK_MAX_CHARS:
        return [paragraph]
    if _is_table(paragraph):
        return _table_pieces(paragraph)
    pieces: list[str] = []
    current = ""
    for sentence in _SENTENCE_END.split(paragraph):
        while len(sentence) > CHUNK_MAX_CHARS:
            cut = sentence.rfind(" ", 0, CHUNK_MAX_CHARS)
            cut = cut if cut > 0 else CHUNK_MAX_CHARS
            if current:
                pieces.append(current)
                current = ""
            pieces.append(sentence[:cut])
            sentence = sentence[cut:].lstrip()
        if current and len(current) + 1 + len(sentence) > CHUNK_MAX_CHARS:
            pieces.append(current)
            current = ""
        current = f"{current} {sentence}" if current else sentence
    if current:
        pieces.append(current)
    return pieces


def article_chunks(body: str) -> list[ChunkText]:
    chunks: list[ChunkText] = []
    for heading, paragraphs in _sections(body):
        current = ""
        for paragraph in paragraphs:
            for piece in _pieces(paragraph):
                # A table is a passage of its own: its rows are read under its header.
                joinable = not _is_table(piece) and not _is_table(
                    current.split("\n\n")[-1] if current else ""
                )
                if current and (not joinable or len(current) + 2 + len(piece) > CHUNK_MAX_CHARS):
                    chunks.append(ChunkText(heading, current))
                    current = ""
                current = f"{current}\n\n{piece}" if current else piece
        if current:
            chunks.append(ChunkText(heading, current))
    return chunks


# --- sentences -----------------------------------------------------------------------------------


def sentences_split(text: str) -> list[str]:
    """The sentences of a paragraph of prose (a full stop inside "$5.95" or "e.g." does not end
    one: a sentence ends at . ! or ? followed by a space and more text)."""
    return [sentence.strip() for sentence in _SENTENCE_END.split(text.strip()) if sentence.strip()]


def _table_rows(table: str) -> list[str]:
    header, rule, *rows = table.splitlines()
    return [f"{header}\n{rule}\n{row}" for row in rows if row.strip()]


def _list_items(paragraph: str) -> tuple[list[str], list[str]]:
    """A paragraph holding a list: the sentences before the list, and its items."""
    lines = paragraph.splitlines()
    first_item = next(i for i, line in enumerate(lines) if _LIST_ITEM.match(line))
    items: list[str] = []
    for line in lines[first_item:]:
        if _LIST_ITEM.match(line) or not items:
            items.append(line.strip())
        else:  # a continuation line of the item above
            items[-1] = f"{items[-1]} {line.strip()}"
    return sentences_split(" ".join(lines[:first_item])), items


def passage_sentences(text: str) -> list[str]:
    """The sentences of a passage (a chunk's text), each quotable alone (see the module's
    docstring). A sentence ending with a colon right before a list introduces it: it comes with
    each item, not alone."""
    sentences: list[str] = []
    for paragraph in text.split("\n\n"):
        if not paragraph.strip():
            continue
        if _is_table(paragraph):
            sentences.extend(_table_rows(paragraph))
        elif any(_LIST_ITEM.match(line) for line in paragraph.splitlines()):
            lead, items = _list_items(paragraph)
            if not lead and sentences and sentences[-1].endswith(":"):
                lead = [sentences.pop()]
            introduction = lead.pop() if lead and lead[-1].endswith(":") else ""
            sentences.extend(lead)
            sentences.extend(f"{introduction}\n{item}" if introduction else item for item in items)
        else:
            sentences.extend(sentences_split(" ".join(paragraph.splitlines())))
    return sentences
