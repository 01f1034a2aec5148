"""`manage.py import_articles <folder>`: load every `*.md` file of a folder as a help article,
and every `*.md` file of its subfolders named after a language (`fr/`, `es/`, `de/`) as the
translation of the article of the same file name.

Idempotent on the slug (the file name, and `-<language>` for a translation): a new slug is
created, a changed file updates its article, an unchanged one is left alone. Retired articles
stay retired. Every change is audited.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from admin_console.services import articles as articles_services
from knowledge.embedding import EmbedderUnavailable
from knowledge.models import Article
from knowledge.services import ArticleFileRejected, article_file_read, embeddings_make_again, embeddings_stale


class Command(BaseCommand):
    help = "Import a folder of Markdown files (`# Title` on the first line) as help articles."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("folder", type=Path)

    def handle(self, *args: Any, folder: Path, **options: Any) -> None:
        if not folder.is_dir():
            raise CommandError(f"{folder} is not a folder")
        # An import has its process to itself: the embedder may use every core, where a web
        # process keeps to one a question (the demo help center: 39 s against 68 s on 2 cores).
        os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
        translations = [
            path
            for language in Article.Language.values
            if language != Article.Language.EN
            for path in sorted((folder / language).glob("*.md"))
        ]
        paths = sorted(folder.glob("*.md")) + translations  # originals first: translations name them
        if not paths:
            raise CommandError(f"{folder} has no .md files")
        try:
            if embeddings_stale():
                count = embeddings_make_again()
                self.stdout.write(f"embedded again {count} articles made with another embedding model")
        except EmbedderUnavailable as exc:
            raise CommandError(str(exc)) from exc
        created, updated, unchanged, failed = [], [], [], []
        # Embedding a new article's sentences takes a moment (a minute for the demo help
        # center's 144 the first time): each one is reported as it is done.
        for n, path in enumerate(paths, start=1):
            try:
                article_file = article_file_read(path)
                article = Article.objects.filter(slug=article_file.slug).first()
                if article is None:
                    original = None
                    if article_file.translates:
                        original = Article.objects.filter(slug=article_file.translates).first()
                        if original is None:
                            raise ArticleFileRejected(f"no article {article_file.translates!r} to translate")
                    articles_services.article_create(
                        actor=None,
                        slug=article_file.slug,
                        title=article_file.title,
                        body=article_file.body,
                        language=article_file.language,
                        translation_of=original,
                    )
                    created.append(article_file.slug)
                    self.stdout.write(f"created {article_file.slug} ({n}/{len(paths)})")
                elif articles_services.article_update(
                    actor=None,
                    article=article,
                    slug=article_file.slug,
                    title=article_file.title,
                    body=article_file.body,
                ):
                    updated.append(article_file.slug)
                    self.stdout.write(f"updated {article_file.slug} ({n}/{len(paths)})")
                else:
                    unchanged.append(article_file.slug)
            except (ArticleFileRejected, ValidationError) as exc:
                failed.append(f"{path.relative_to(folder)}: {exc}")
            except EmbedderUnavailable as exc:
                raise CommandError(str(exc)) from exc
        for problem in failed:
            self.stderr.write(f"skipped {problem}")
        self.stdout.write(
            f"{len(created)} created, {len(updated)} updated, {len(unchanged)} unchanged, "
            f"{len(failed)} skipped, from {folder}"
        )
        if failed:
            raise CommandError(f"{len(failed)} file(s) could not be imported")
