"""Reads of the help center: articles for the console and the public pages, and the excerpts
that answer a customer's question."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from django.conf import settings
from django.db.models import QuerySet
from django.urls import reverse

from knowledge.embedding import EmbedderUnavailable, embed_queries
from knowledge.index import knowledge_base_version
from knowledge.models import Article
from knowledge.retrieval import Retrieval

__all__ = [
    "EmbedderUnavailable",
    "Excerpt",
    "Source",
    "article_public",
    "article_public_moved_from",
    "articles_all",
    "articles_public",
    "excerpts_of",
    "knowledge_base_version",
    "question_vector",
]


# How much lower than the best a passage's sentence may score and still be given to a model: on
# multilingual e5's scale, where every passage of a shop's help center scores 0.8 or more against
# a shop question, a floor alone would quote all of them.
EXCERPT_MARGIN = 0.04


@dataclass(frozen=True, slots=True)
class Source:
    slug: str
    title: str

    @property
    def url(self) -> str:
        return reverse("knowledge:article", args=[self.slug])

    def as_dict(self) -> dict[str, str]:
        return {"slug": self.slug, "title": self.title}


@dataclass(frozen=True, slots=True)
class Excerpt:
    source: Source
    heading: str
    text: str
    score: float


def question_vector(question: str) -> np.ndarray:
    """The question's embedding, as retrieval and the result cache compare it. Raises
    EmbedderUnavailable when the embedding model cannot load."""
    (vector,) = embed_queries([question])
    return vector


def excerpts_of(
    retrieval: Retrieval, *, max_chars: int | None = None, min_score: float | None = None
) -> tuple[Excerpt, ...]:
    """The passages holding the best sentences, best first, each once: those whose sentence
    scores at least `min_score` (default KNOWLEDGE_MIN_SCORE) and at most EXCERPT_MARGIN below
    the best, at most KNOWLEDGE_MAX_EXCERPTS of them and `max_chars` (default
    KNOWLEDGE_PROMPT_MAX_CHARS) of text in all. What a model answering from the help center is
    given."""
    max_chars = settings.KNOWLEDGE_PROMPT_MAX_CHARS if max_chars is None else max_chars
    min_score = settings.KNOWLEDGE_MIN_SCORE if min_score is None else min_score
    if retrieval.ranked:
        min_score = max(min_score, retrieval.ranked[0].score - EXCERPT_MARGIN)
    index = retrieval.index
    excerpts: list[Excerpt] = []
    seen: set[int] = set()
    room = max_chars
    for ranked in retrieval.ranked:
        chunk_at = int(index.sentence_chunk[ranked.sentence])
        if ranked.score < min_score or len(excerpts) >= settings.KNOWLEDGE_MAX_EXCERPTS:
            break
        chunk = index.chunks[chunk_at]
        if chunk_at in seen or len(chunk.text) > room:
            continue
        seen.add(chunk_at)
        room -= len(chunk.text)
        article = index.articles[chunk.article]
        excerpts.append(Excerpt(Source(article.slug, article.title), chunk.heading, chunk.text, ranked.score))
    return tuple(excerpts)


def articles_all() -> QuerySet[Article]:
    """Every article, active first, for the console."""
    return Article.objects.order_by("status", "title")


def articles_public() -> QuerySet[Article]:
    return Article.objects.filter(status=Article.Status.ACTIVE).order_by("title")


def article_public(*, slug: str) -> Article | None:
    return articles_public().filter(slug=slug).first()


def article_public_moved_from(*, slug: str) -> Article | None:
    """The public article that was at `slug` before it moved (FormerSlug)."""
    return articles_public().filter(former_slugs__slug=slug).first()
