from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

from knowledge.embedding import embedder_problem

DEMO_HELP_CENTER = Path(settings.BASE_DIR) / "knowledge" / "demo_help_center"


@pytest.fixture(autouse=True)
def _embedding_model_installed():
    problem = embedder_problem()
    if problem is not None:
        pytest.fail(f"The help center's embedding model cannot load: {problem}")


@pytest.fixture(scope="module")
def _demo_help_center_stored(django_db_setup, django_db_blocker):
    """The demo help center in its four languages, imported once for the module as `make run`
    imports it (its 144 articles take a while to store), and removed after it."""
    from admin_console.models import AuditLog
    from knowledge.models import Article, KnowledgeBase

    with django_db_blocker.unblock():
        call_command("import_articles", str(DEMO_HELP_CENTER), stdout=StringIO())
    yield
    with django_db_blocker.unblock():
        Article.objects.all().delete()
        KnowledgeBase.objects.all().delete()
        AuditLog.objects.all().delete()


@pytest.fixture
def help_center(_demo_help_center_stored, db) -> None:
    """The demo help center; what a test changes in it is rolled back after the test."""
