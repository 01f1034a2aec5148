"""Writes to the help center. Every change re-chunks and re-embeds what it touched and raises
the knowledge-base version in the same transaction, so the index and the version agree, and
drops the cached answers the change made stale (knowledge.cache).

The console audits these through admin_console.services.articles; nothing else should call them directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from django.db import transaction
from django.db.models import F
from django.utils.text import slugify

from knowledge.cache import answers_invalidate
from knowledge.chunking import ChunkText, article_chunks, passage_sentences
from knowledge.embedding import EMBEDDING_DIM, EMBEDDING_MODEL, embed_passages, embed_queries
from knowledge.index import current_index
from knowledge.models import Article, CachedAnswer, Chunk, FormerSlug, KnowledgeBase, Sentence


class ArticleFileRejected(ValueError):
    """A Markdown file that is not an article (no `# Title` line, or no body)."""


@dataclass(frozen=True, slots=True)
class ArticleFile:
    slug: str
    title: str
    body: str
    language: str = Article.Language.EN
    translates: str = ""  # the slug of the article it translates ("": an original)


def _passages(article: Article) -> np.ndarray:
    """The embeddings of the article's chunks as stored (none for an article not saved yet)."""
    if article.pk is None:
        return np.zeros((0, EMBEDDING_DIM), dtype=np.float32)
    rows = b"".join(bytes(vector) for vector in article.chunks.values_list("embedding", flat=True))
    return np.frombuffer(rows, dtype="<f4").reshape(-1, EMBEDDING_DIM)


def _version_raise(article: Article, *, passages_before: np.ndarray) -> None:
    """A new version for a change to `article`, and the cached answers it may have made stale
    dropped: those its passages before (`passages_before`) or after the change bear on
    (knowledge.cache.answers_invalidate)."""
    if not KnowledgeBase.objects.filter(pk=1).update(version=F("version") + 1):
        KnowledgeBase.objects.get_or_create(pk=1, defaults={"version": 1, "embedding_model": EMBEDDING_MODEL})
    answers_invalidate(
        article=article,
        passages=np.concatenate([passages_before, _passages(article)]),
        new_version=KnowledgeBase.objects.get(pk=1).version,
    )
    # This process searches the new version at once; the others notice within VERSION_CHECK_S.
    transaction.on_commit(current_index.forget)


def _chunks_replace(article: Article) -> None:
    """The article's passages and their sentences, each embedded with the article's title and
    the section's heading. Embeds before it deletes, so a failing embedder leaves the old
    chunks in place."""
    pieces = article_chunks(article.body)
    sentences = [passage_sentences(piece.text) for piece in pieces]
    vectors = embed_passages(
        [piece.embedding_input(article.title) for piece in pieces]
        + [
            ChunkText(piece.heading, sentence).embedding_input(article.title)
            for piece, texts in zip(pieces, sentences, strict=True)
            for sentence in texts
        ]
    )
    article.chunks.all().delete()
    chunks = Chunk.objects.bulk_create(
        Chunk(article=article, position=i, heading=piece.heading, text=piece.text, embedding=vector.tobytes())
        for i, (piece, vector) in enumerate(zip(pieces, vectors, strict=False))
    )
    sentence_vectors = iter(vectors[len(pieces) :])
    Sentence.objects.bulk_create(
        Sentence(chunk=chunk, position=i, text=text, embedding=next(sentence_vectors).tobytes())
        for chunk, texts in zip(chunks, sentences, strict=True)
        for i, text in enumerate(texts)
    )


def article_create(
    *,
    slug: str,
    title: str,
    body: str,
    language: str = Article.Language.EN,
    translation_of: Article | None = None,
) -> Article:
    """Raises ValidationError (a slug in use, an empty title or body, an unknown language)."""
    article = Article(
        slug=slug, title=title.strip(), body=body.strip(), language=language, translation_of=translation_of
    )
    article.full_clean()
    with transaction.atomic():
        passages_before = _passages(article)
        article.save()
        _chunks_replace(article)
        _version_raise(article, passages_before=passages_before)
    return article


def article_update(*, article: Article, title: str, body: str, slug: str | None = None) -> bool:
    """False when nothing changed (no new version). A new `slug` keeps the old address leading
    to the article (FormerSlug)."""
    title, body = title.strip(), body.strip()
    former_slug = article.slug
    slug = former_slug if slug is None else slug
    if (article.slug, article.title, article.body) == (slug, title, body):
        return False
    article.slug, article.title, article.body = slug, title, body
    article.full_clean()
    with transaction.atomic():
        passages_before = _passages(article)
        article.save()
        if slug != former_slug:
            FormerSlug.objects.update_or_create(slug=former_slug, defaults={"article": article})
        _chunks_replace(article)
        _version_raise(article, passages_before=passages_before)
    return True


def article_status_set(*, article: Article, status: Article.Status) -> bool:
    """Retire or restore. False when it already had that status."""
    if article.status == status:
        return False
    with transaction.atomic():
        article.status = status
        article.save(update_fields=["status", "updated_at"])
        # Its chunks stay (a retired article's are only left out of the index): before = after.
        _version_raise(article, passages_before=_passages(article))
    return True


def embeddings_stale() -> bool:
    """Whether the stored embeddings were made with another model than the one that embeds
    questions now (they would not compare)."""
    made_with = KnowledgeBase.objects.values_list("embedding_model", flat=True).filter(pk=1).first()
    return made_with is not None and made_with != EMBEDDING_MODEL and Article.objects.exists()


def embeddings_make_again() -> int:
    """Embed every article's passages and sentences, and every cached question, with the current
    model, in one transaction with a new version. Returns the articles embedded."""
    with transaction.atomic():
        articles = list(Article.objects.all())
        for article in articles:
            _chunks_replace(article)
        entries = list(CachedAnswer.objects.only("pk", "question"))
        vectors = embed_queries([entry.question for entry in entries])
        for entry, vector in zip(entries, vectors, strict=True):
            CachedAnswer.objects.filter(pk=entry.pk).update(embedding=vector.tobytes())
        KnowledgeBase.objects.filter(pk=1).update(version=F("version") + 1, embedding_model=EMBEDDING_MODEL)
        transaction.on_commit(current_index.forget)
    return len(articles)


def article_file_read(path: Path) -> ArticleFile:
    """`returns-policy.md` starting with `# Returns policy` -> slug, title and the rest as body.
    A file in a folder named after a language (`fr/returns-policy.md`) is the translation of the
    article of the same name: its slug is `returns-policy-fr`."""
    lines = path.read_text(encoding="utf-8").strip().splitlines()
    if not lines or not lines[0].startswith("# "):
        raise ArticleFileRejected(f"{path.name}: the first line must be the title, as `# Title`")
    body = "\n".join(lines[1:]).strip()
    if not body:
        raise ArticleFileRejected(f"{path.name}: no text after the title")
    slug = slugify(path.stem)
    if not slug:
        raise ArticleFileRejected(f"{path.name}: the file name gives no slug")
    language = path.parent.name
    if language in Article.Language.values and language != Article.Language.EN:
        return ArticleFile(
            slug=f"{slug}-{language}",
            title=lines[0][2:].strip(),
            body=body,
            language=language,
            translates=slug,
        )
    return ArticleFile(slug=slug, title=lines[0][2:].strip(), body=body)
