"""System checks for the help center: `manage.py check` runs them, and so does every process
when it starts (config/startup.py)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from knowledge.embedding import missing_embedder_files


@register()
def embedding_model_check(**kwargs: Any) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    missing = missing_embedder_files(settings.KNOWLEDGE_EMBEDDING_MODEL)
    if missing:
        messages.append(
            Warning(
                f"The sentence-embedding model is not prepared at {settings.KNOWLEDGE_EMBEDDING_MODEL} "
                f"(missing: {', '.join(missing)}): chat answers go without help-center excerpts, "
                "and articles cannot be saved.",
                hint="Run `make embedder` (or `python manage.py prepare_embedder`).",
                id="knowledge.W001",
            )
        )
    if not 0 < settings.KNOWLEDGE_MIN_SCORE < 1:
        messages.append(
            Error(
                f"KNOWLEDGE_MIN_SCORE = {settings.KNOWLEDGE_MIN_SCORE:g}: it is a cosine similarity, "
                "and outside 0..1 every excerpt or none would count as relevant.",
                hint="Set KNOWLEDGE_MIN_SCORE between 0 and 1 (default 0.3).",
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
