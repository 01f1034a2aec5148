from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

from knowledge.embedding import missing_embedder_files

DEMO_HELP_CENTER = Path(settings.BASE_DIR) / "knowledge" / "demo_help_center"


@pytest.fixture(autouse=True)
def _embedding_model_prepared():
    missing = missing_embedder_files(settings.KNOWLEDGE_EMBEDDING_MODEL)
    if missing:
        pytest.fail(f"The embedding model is not prepared (missing {missing}): run `make embedder`")


@pytest.fixture
def help_center(db) -> None:
    """The demo help center, imported as `make run` does."""
    call_command("import_articles", str(DEMO_HELP_CENTER), stdout=StringIO())
