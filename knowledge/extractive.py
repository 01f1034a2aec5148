"""Extractive answers: the help center's own sentences, chosen for the question, in the order
the article has them. Nothing is written that the help center does not say, so an answer can
be incomplete but never invent a policy, a price or a date.

The sentences quoted are the best one and those nearly as good (a question asking two things,
or a fact that takes two sentences to state), at most MAX_SENTENCES: items of one list are
shown as that list under its introduction, rows of one table as that table under its header.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from knowledge.index import IndexedArticle
from knowledge.retrieval import Retrieval

MAX_SENTENCES = 4
# How much lower than the best a sentence may score and still be quoted with it (on the
# scale of a cosine similarity): closer for another article than for the best one's own.
SAME_ARTICLE_MARGIN = 0.04
OTHER_ARTICLE_MARGIN = 0.015
# The kinds of facts (knowledge.facts) that make a sentence state a figure.
FIGURES = frozenset({"amount", "percent", "duration", "number"})

# Said before a quote in another language than the customer's (the help center has no article
# in theirs).
OTHER_LANGUAGE_LEADS = {
    "en": "Our help center has this in another language:",
    "fr": "Notre centre d'aide l'explique dans une autre langue :",
    "es": "Nuestro centro de ayuda lo explica en otro idioma:",
    "de": "Unser Hilfe-Center erklärt das in einer anderen Sprache:",
}


@dataclass(frozen=True, slots=True)
class Extract:
    text: str  # Markdown
    sentences: tuple[str, ...]  # the help center's sentences quoted, as stored
    sources: tuple[IndexedArticle, ...]  # the articles quoted, best first


def sentences_choose(retrieval: Retrieval) -> list[int]:
    """The sentences to quote (indexes into the index), in the articles' order."""
    if not retrieval.ranked:
        return []
    index = retrieval.index
    best = retrieval.ranked[0]
    best_article = int(index.sentence_article[best.sentence])
    near = [
        candidate.sentence
        for candidate in retrieval.ranked[1:]
        if candidate.score
        >= best.score
        - (
            SAME_ARTICLE_MARGIN
            if int(index.sentence_article[candidate.sentence]) == best_article
            else OTHER_ARTICLE_MARGIN
        )
    ]
    # A customer asks a help center for specifics: of the sentences nearly as good as the best,
    # those that state a figure (a price, a delay, a count) are quoted first, best first within
    # each kind; a question that asks nothing of the sort still gets its best sentence.
    near.sort(key=lambda i: not index.sentences[i].fact_kinds & FIGURES)
    chosen = [best.sentence, *near[: MAX_SENTENCES - 1]]
    return sorted(
        chosen,
        key=lambda i: (
            int(index.sentence_article[i]) != best_article,
            int(index.sentence_article[i]),
            int(index.sentence_chunk[i]),
            index.sentences[i].position,
        ),
    )


def _blocks(texts: list[str]) -> list[str]:
    """Sentences as Markdown blocks: list items sharing an introduction under it once, table
    rows sharing a header under it once."""
    blocks: list[tuple[str, list[str]]] = []  # (introduction or header, items or rows)
    for text in texts:
        if text.startswith("|") and text.count("\n") == 2:
            header, rule, row = text.split("\n")
            head = f"{header}\n{rule}"
            if blocks and blocks[-1][0] == head:
                blocks[-1][1].append(row)
            else:
                blocks.append((head, [row]))
        elif "\n" in text:
            introduction, item = text.split("\n", 1)
            if blocks and blocks[-1][0] == introduction:
                blocks[-1][1].append(item)
            else:
                blocks.append((introduction, [item]))
        elif blocks and blocks[-1][0] == _block_kind(text):
            blocks[-1][1].append(text)
        else:
            blocks.append((_block_kind(text), [text]))
    out: list[str] = []
    for head, parts in blocks:
        if head.startswith("|"):
            out.append("\n".join([head, *parts]))
        elif head == _ITEMS:
            out.append("\n".join(part.rstrip(";,") for part in parts))
        elif head:
            out.append("\n".join([head, *(part.rstrip(";,") for part in parts)]))
        else:
            out.append(" ".join(parts))
    return out


_ITEMS = "\x00items"  # a block of list items with no introduction
_ITEM = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s")


def _block_kind(text: str) -> str:
    """A sentence alone: a list item (one per line) or prose (joined into a paragraph)."""
    return _ITEMS if _ITEM.match(text) else ""


def extract(retrieval: Retrieval) -> Extract | None:
    """The answer quoted from the help center, or None when nothing was found."""
    chosen = sentences_choose(retrieval)
    if not chosen:
        return None
    index = retrieval.index
    texts = [index.sentences[i].text for i in chosen]
    sources = tuple(dict.fromkeys(index.article_of(i) for i in chosen))
    body = "\n\n".join(_blocks(texts))
    quoted_language = sources[0].language
    if quoted_language != retrieval.language:
        lead = OTHER_LANGUAGE_LEADS.get(retrieval.language, OTHER_LANGUAGE_LEADS["en"])
        body = f"{lead}\n\n{body}"
    return Extract(text=body, sentences=tuple(texts), sources=sources)
