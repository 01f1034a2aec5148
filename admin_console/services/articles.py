"""Writes of the help articles page (and `manage.py import_articles`): each change audited."""

from __future__ import annotations

import hashlib
from typing import Any

from django.db import transaction

from accounts.models import User
from admin_console.models import AuditLog
from admin_console.services.audit import _audit
from knowledge import services as knowledge_services
from knowledge.models import Article

# `actor` None: articles imported from Markdown files (`manage.py import_articles`).
IMPORT_ACTOR_NAME = "manage.py import_articles"


def _article_values(article: Article) -> dict[str, Any]:
    """The body by size and digest: the audit log says that it changed, the article says how."""
    return {
        "slug": article.slug,
        "title": article.title,
        "status": article.status,
        "language": article.language,
        "translation_of": article.translation_of.slug if article.translation_of else None,
        "body_chars": len(article.body),
        "body_sha256": hashlib.sha256(article.body.encode()).hexdigest()[:12],
    }


def article_create(
    *,
    actor: User | None,
    slug: str,
    title: str,
    body: str,
    language: str = Article.Language.EN,
    translation_of: Article | None = None,
) -> Article:
    """Raises ValidationError, or knowledge.embedding.EmbedderUnavailable."""
    with transaction.atomic():
        article = knowledge_services.article_create(
            slug=slug, title=title, body=body, language=language, translation_of=translation_of
        )
        _audit(
            actor=actor,
            action=AuditLog.Action.ARTICLE_CREATE,
            target=article.slug,
            before=None,
            after=_article_values(article),
            unattended_by=IMPORT_ACTOR_NAME,
        )
    return article


def article_update(*, actor: User | None, article: Article, slug: str, title: str, body: str) -> bool:
    """False when nothing changed. Raises ValidationError, or EmbedderUnavailable."""
    with transaction.atomic():
        before = _article_values(article)
        changed = knowledge_services.article_update(article=article, slug=slug, title=title, body=body)
        if changed:
            _audit(
                actor=actor,
                action=AuditLog.Action.ARTICLE_UPDATE,
                target=article.slug,
                before=before,
                after=_article_values(article),
                unattended_by=IMPORT_ACTOR_NAME,
            )
    return changed


def article_status_set(*, actor: User | None, article: Article, status: Article.Status) -> bool:
    """Retire or restore an article; False when it already had that status."""
    with transaction.atomic():
        before = _article_values(article)
        changed = knowledge_services.article_status_set(article=article, status=status)
        if changed:
            _audit(
                actor=actor,
                action=(
                    AuditLog.Action.ARTICLE_RETIRE
                    if status == Article.Status.RETIRED
                    else AuditLog.Action.ARTICLE_RESTORE
                ),
                target=article.slug,
                before=before,
                after=_article_values(article),
                unattended_by=IMPORT_ACTOR_NAME,
            )
    return changed
