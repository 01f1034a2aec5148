"""The help center: articles in Markdown, their chunks with embeddings, one version number that
every edit raises (the retrieval index and the cached answers key on it), and the result
cache's entries."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from scheduler.models import generation_link


class Article(models.Model):
    """An article of the help center, in one language. A translation names the article it
    translates (`translation_of`): a question is answered from the articles in its own
    language first (knowledge.retrieval), and the public page links the versions."""

    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        RETIRED = "retired", "Retired"  # kept for the record; never shown or retrieved

    class Language(models.TextChoices):
        EN = "en", "English"
        FR = "fr", "Français"
        ES = "es", "Español"
        DE = "de", "Deutsch"

    slug = models.SlugField(max_length=100, unique=True)
    title = models.CharField(max_length=200)
    body = models.TextField(help_text="Markdown.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    language = models.CharField(max_length=8, choices=Language.choices, default=Language.EN)
    translation_of = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        related_name="translations",
        on_delete=models.SET_NULL,
        help_text="The article this one translates (blank for an original).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["title", "id"]

    def __str__(self) -> str:
        return self.title


class FormerSlug(models.Model):
    """An address an article had before it moved: /help/<slug> still leads to it, so the links
    under earlier answers (Message.sources keeps the slug) and bookmarks keep working. The
    article that last left an address owns it; a live article at that address comes first."""

    slug = models.SlugField(max_length=100, unique=True)
    article = models.ForeignKey(Article, related_name="former_slugs", on_delete=models.CASCADE)

    def __str__(self) -> str:
        return f"{self.slug} -> {self.article.slug}"


class Chunk(models.Model):
    """A passage of an article (a section, or part of one) and its sentence embedding."""

    article = models.ForeignKey(Article, related_name="chunks", on_delete=models.CASCADE)
    position = models.PositiveIntegerField()
    heading = models.CharField(max_length=200, blank=True)
    text = models.TextField()
    # float32 little-endian, unit length (knowledge.embedding.EMBEDDING_DIM values).
    embedding = models.BinaryField()

    class Meta:
        ordering = ["article", "position"]
        constraints = [models.UniqueConstraint(fields=["article", "position"], name="chunk_position")]


class Sentence(models.Model):
    """A sentence of a passage as knowledge.chunking.passage_sentences cuts it (a sentence, a
    list item with the line introducing its list, a table row under its header), and its
    embedding: what extractive answers quote and retrieval ranks."""

    chunk = models.ForeignKey(Chunk, related_name="sentences", on_delete=models.CASCADE)
    position = models.PositiveIntegerField()
    text = models.TextField()
    # float32 little-endian, unit length (knowledge.embedding.EMBEDDING_DIM values).
    embedding = models.BinaryField()

    class Meta:
        ordering = ["chunk", "position"]
        constraints = [models.UniqueConstraint(fields=["chunk", "position"], name="sentence_position")]


class KnowledgeBase(models.Model):
    """One row (pk 1): the version of the whole help center, and the model its embeddings were
    made with (knowledge.embedding.EMBEDDING_MODEL; a change re-embeds everything)."""

    version = models.PositiveBigIntegerField(default=1)
    embedding_model = models.CharField(max_length=100, blank=True)
    updated_at = models.DateTimeField(auto_now=True)


class CachedAnswer(models.Model):
    """A first-turn question and the answer that may be served again for it, per variant and
    prompt recipe (`context`, a hash of everything else that shapes the answer), on the
    knowledge-base version it was answered from. See knowledge.cache for when one is stored,
    served and dropped.

    A generated entry is stored when its question is queued and names its generation; it is
    served only once that generation finished well. A pinned entry holds an answer staff
    approved, and outlives article edits until staff remove it.
    """

    variant = models.CharField(max_length=64)
    context = models.CharField(max_length=64)
    question = models.TextField()
    question_hash = models.CharField(max_length=64)  # of the normalised question: exact matches
    # float32 little-endian, unit length (knowledge.embedding.EMBEDDING_DIM values).
    embedding = models.BinaryField()
    kb_version = models.PositiveBigIntegerField()
    # The answer's prompt held the help center's excerpts (chat with the help center on); an
    # article change may then make it stale. /v1 answers and the others never read an article.
    help_center = models.BooleanField(default=True)
    sources = models.ManyToManyField(Article, related_name="cached_answers", blank=True)
    generation = generation_link("cached_answer")
    pinned_answer = models.TextField(blank=True)  # non-empty: staff approved this answer
    pinned_by = models.CharField(max_length=150, blank=True)
    # Keyed hashes of the distinct customers the answer was given to (written for, or served
    # for the very same question), up to ANSWER_CACHE_SHARE_AFTER: then it answers paraphrases.
    given_to = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["variant", "context", "question_hash"])]

    def __str__(self) -> str:
        return f"{self.variant}: {self.question[:60]}"

    @property
    def pinned(self) -> bool:
        return bool(self.pinned_answer)

    @property
    def shared(self) -> bool:
        """Whether it may answer paraphrases of its question, not only that very question."""
        return self.pinned or len(self.given_to) >= settings.ANSWER_CACHE_SHARE_AFTER
