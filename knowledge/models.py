"""The help center: articles in Markdown, their chunks with embeddings, and one version number
that every edit raises (the retrieval index and, later, cached answers key on it)."""

from __future__ import annotations

from django.db import models


class Article(models.Model):
    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        RETIRED = "retired", "Retired"  # kept for the record; never shown or retrieved

    slug = models.SlugField(max_length=100, unique=True)
    title = models.CharField(max_length=200)
    body = models.TextField(help_text="Markdown.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["title", "id"]

    def __str__(self) -> str:
        return self.title


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


class KnowledgeBase(models.Model):
    """One row (pk 1): the version of the whole help center."""

    version = models.PositiveBigIntegerField(default=1)
    updated_at = models.DateTimeField(auto_now=True)
