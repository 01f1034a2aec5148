"""Articles -> passages small enough to match one question and to quote in a prompt.

A passage is a section (the text under a Markdown heading), split at paragraphs, then at
sentences, into pieces of at most CHUNK_MAX_CHARS. What is embedded carries the article's title
and the section's heading, so "How long does it take?" under "Standard delivery" in "Shipping"
still reads as a shipping question.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CHUNK_MAX_CHARS = 500

_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True, slots=True)
class ChunkText:
    heading: str
    text: str

    def embedding_input(self, title: str) -> str:
        return "\n".join(part for part in (title, self.heading, self.text) if part)


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
            paragraph.append(line.rstrip())
        else:
            close_paragraph()
    close_paragraph()
    return [(heading, paragraphs) for heading, paragraphs in sections if paragraphs]


def _pieces(paragraph: str) -> list[str]:
    """A paragraph longer than CHUNK_MAX_CHARS, cut between sentences (or words, if it must)."""
    if len(paragraph) <= CHUNK_MAX_CHARS:
        return [paragraph]
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
                if current and len(current) + 2 + len(piece) > CHUNK_MAX_CHARS:
                    chunks.append(ChunkText(heading, current))
                    current = ""
                current = f"{current}\n\n{piece}" if current else piece
        if current:
            chunks.append(ChunkText(heading, current))
    return chunks
