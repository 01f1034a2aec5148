"""Reads of the help center: articles for the console and the public pages, and the excerpts
that answer a customer's question."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from django.conf import settings
from django.db.models import QuerySet
from django.urls import reverse

from knowledge.embedding import EmbedderUnavailable, embed
from knowledge.index import current_index, knowledge_base_version
from knowledge.models import Article

__all__ = [
    "EmbedderUnavailable",
    "Excerpt",
    "HelpCenterExcerpts",
    "Source",
    "article_public",
    "article_public_moved_from",
    "articles_all",
    "articles_public",
    "help_center_excerpts",
    "knowledge_base_version",
    "question_vector",
]


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


@dataclass(frozen=True, slots=True)
class HelpCenterExcerpts:
    """What the help center says about a question; empty when nothing is relevant enough."""

    excerpts: tuple[Excerpt, ...]
    version: int  # the knowledge base searched
    searched: bool = True  # False: the help center has no articles, so nothing was searched

    @property
    def sources(self) -> tuple[Source, ...]:
        """The articles quoted, best first, each once."""
        return tuple(dict.fromkeys(excerpt.source for excerpt in self.excerpts))


def question_vector(question: str) -> np.ndarray:
    """The question's embedding, as retrieval and the result cache compare it. Raises
    EmbedderUnavailable when the embedding model is not prepared."""
    (vector,) = embed([question])
    return vector


def help_center_excerpts(
    *,
    question: str,
    vector: np.ndarray | None = None,
    max_chars: int | None = None,
    min_score: float | None = None,
) -> HelpCenterExcerpts:
    """The passages most relevant to `question` that score at least `min_score` (default
    KNOWLEDGE_MIN_SCORE), at most KNOWLEDGE_MAX_EXCERPTS of them and `max_chars` (default
    KNOWLEDGE_PROMPT_MAX_CHARS) of text in all. `vector`: the question's, if already embedded.

    Raises EmbedderUnavailable when the embedding model is not prepared and there are
    articles to search.
    """
    max_chars = settings.KNOWLEDGE_PROMPT_MAX_CHARS if max_chars is None else max_chars
    min_score = settings.KNOWLEDGE_MIN_SCORE if min_score is None else min_score
    index = current_index.get()
    if not index.chunks:  # nothing to find: the question's embedding would cost a post ~5 ms
        return HelpCenterExcerpts(excerpts=(), version=index.version, searched=False)
    query = question_vector(question) if vector is None else vector
    excerpts: list[Excerpt] = []
    room = max_chars
    for hit in index.search(query, limit=settings.KNOWLEDGE_MAX_EXCERPTS, min_score=min_score):
        if len(hit.chunk.text) > room:
            continue
        room -= len(hit.chunk.text)
        source = Source(hit.chunk.slug, hit.chunk.title)
        excerpts.append(Excerpt(source, hit.chunk.heading, hit.chunk.text, hit.score))
    return HelpCenterExcerpts(excerpts=tuple(excerpts), version=index.version)


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
