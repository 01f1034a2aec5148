"""`manage.py import_articles <folder>`: load every `*.md` file of a folder as a help article.

Idempotent on the slug (the file name): a new slug is created, a changed file updates its
article, an unchanged one is left alone. Retired articles stay retired. Every change is audited.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from admin_console import services as console_services
from knowledge.embedding import EmbedderUnavailable
from knowledge.models import Article
from knowledge.services import ArticleFileRejected, article_file_read


class Command(BaseCommand):
    help = "Import a folder of Markdown files (`# Title` on the first line) as help articles."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("folder", type=Path)

    def handle(self, *args: Any, folder: Path, **options: Any) -> None:
        if not folder.is_dir():
            raise CommandError(f"{folder} is not a folder")
        paths = sorted(folder.glob("*.md"))
        if not paths:
            raise CommandError(f"{folder} has no .md files")
        created, updated, unchanged, failed = [], [], [], []
        for path in paths:
            try:
                article_file = article_file_read(path)
                article = Article.objects.filter(slug=article_file.slug).first()
                if article is None:
                    console_services.article_create(
                        actor=None, slug=article_file.slug, title=article_file.title, body=article_file.body
                    )
                    created.append(article_file.slug)
                elif console_services.article_update(
                    actor=None,
                    article=article,
                    slug=article_file.slug,
                    title=article_file.title,
                    body=article_file.body,
                ):
                    updated.append(article_file.slug)
                else:
                    unchanged.append(article_file.slug)
            except (ArticleFileRejected, ValidationError) as exc:
                failed.append(f"{path.name}: {exc}")
            except EmbedderUnavailable as exc:
                raise CommandError(str(exc)) from exc
        for slug in created:
            self.stdout.write(f"created {slug}")
        for slug in updated:
            self.stdout.write(f"updated {slug}")
        for problem in failed:
            self.stderr.write(f"skipped {problem}")
        self.stdout.write(
            f"{len(created)} created, {len(updated)} updated, {len(unchanged)} unchanged, "
            f"{len(failed)} skipped, from {folder}"
        )
        if failed:
            raise CommandError(f"{len(failed)} file(s) could not be imported")
