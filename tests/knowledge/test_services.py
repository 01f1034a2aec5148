"""Writing the help center: every change re-embeds its article and raises the version, and the
import command is idempotent on the slug."""

from io import StringIO
from pathlib import Path

import numpy as np
import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from admin_console.models import AuditLog
from knowledge import services
from knowledge.embedding import EMBEDDING_DIM
from knowledge.index import knowledge_base_version
from knowledge.models import Article, Chunk, KnowledgeBase
from tests.knowledge.conftest import DEMO_HELP_CENTER

pytestmark = pytest.mark.django_db

BODY = "Intro.\n\n## Standard\n\n3 to 5 business days.\n\n## Express\n\n1 to 2 business days."


def test_an_article_is_stored_with_one_unit_length_embedding_per_section_and_a_new_version():
    version = knowledge_base_version()
    article = services.article_create(slug="shipping", title="Shipping", body=BODY)
    chunks = list(article.chunks.all())
    assert [chunk.heading for chunk in chunks] == ["", "Standard", "Express"]
    for chunk in chunks:
        vector = np.frombuffer(chunk.embedding, dtype="<f4")
        assert vector.shape == (EMBEDDING_DIM,)
        assert abs(float(np.linalg.norm(vector)) - 1) < 1e-4
    assert knowledge_base_version() == version + 1


def test_an_edit_replaces_the_passages_and_an_edit_that_changes_nothing_keeps_the_version():
    article = services.article_create(slug="shipping", title="Shipping", body=BODY)
    version = knowledge_base_version()
    assert services.article_update(article=article, title="Shipping", body="Only one paragraph now.")
    assert list(article.chunks.values_list("text", flat=True)) == ["Only one paragraph now."]
    assert knowledge_base_version() == version + 1
    assert not services.article_update(article=article, title="Shipping ", body="Only one paragraph now.")
    assert knowledge_base_version() == version + 1


def test_a_slug_in_use_is_refused_and_leaves_nothing_behind():
    services.article_create(slug="shipping", title="Shipping", body=BODY)
    version = knowledge_base_version()
    with pytest.raises(ValidationError):
        services.article_create(slug="shipping", title="Other", body="Other text.")
    assert Article.objects.count() == 1
    assert knowledge_base_version() == version


def test_retiring_raises_the_version_once():
    article = services.article_create(slug="shipping", title="Shipping", body=BODY)
    version = knowledge_base_version()
    assert services.article_status_set(article=article, status=Article.Status.RETIRED)
    assert not services.article_status_set(article=article, status=Article.Status.RETIRED)
    assert knowledge_base_version() == version + 1


def _import(folder: Path) -> str:
    out = StringIO()
    call_command("import_articles", str(folder), stdout=out)
    return out.getvalue()


def test_the_demo_help_center_imports_once_and_a_second_import_changes_nothing():
    first = _import(DEMO_HELP_CENTER)
    count = len(list(DEMO_HELP_CENTER.glob("*.md"))) + len(list(DEMO_HELP_CENTER.glob("*/*.md")))
    assert count == 4 * 36  # in English, French, Spanish and German
    assert f"{count} created, 0 updated, 0 unchanged, 0 skipped" in first
    assert "created returns-policy (" in first and "created returns-policy-fr (" in first
    french = Article.objects.get(slug="returns-policy-fr")
    assert (french.language, french.translation_of.slug) == ("fr", "returns-policy")
    version = knowledge_base_version()
    chunks = Chunk.objects.count()

    second = _import(DEMO_HELP_CENTER)
    assert f"0 created, 0 updated, {count} unchanged, 0 skipped" in second
    assert (knowledge_base_version(), Chunk.objects.count()) == (version, chunks)
    audited = AuditLog.objects.filter(action=AuditLog.Action.ARTICLE_CREATE)
    assert audited.count() == count
    assert {entry.actor_name for entry in audited} == {"manage.py import_articles"}


def test_an_import_updates_changed_files_and_reports_files_it_cannot_read(tmp_path):
    (tmp_path / "returns.md").write_text("# Returns\n\nWithin 30 days.")
    _import(tmp_path)
    (tmp_path / "returns.md").write_text("# Returns\n\nWithin 60 days.")
    (tmp_path / "notes.md").write_text("no title line")
    err = StringIO()
    with pytest.raises(CommandError, match="1 file"):
        call_command("import_articles", str(tmp_path), stdout=StringIO(), stderr=err)
    assert "notes.md: the first line must be the title" in err.getvalue()
    assert Article.objects.get(slug="returns").body == "Within 60 days."
    update = AuditLog.objects.get(action=AuditLog.Action.ARTICLE_UPDATE)
    assert [name for name, _, _ in update.changes()] == ["body_sha256"]


def test_a_translation_without_its_original_is_reported_and_the_rest_imported(tmp_path):
    (tmp_path / "returns.md").write_text("# Returns\n\nWithin 30 days.")
    (tmp_path / "fr").mkdir()
    (tmp_path / "fr" / "returns.md").write_text("# Retours\n\nSous 30 jours.")
    (tmp_path / "fr" / "gifts.md").write_text("# Cadeaux\n\nPapier cadeau.")
    err = StringIO()
    with pytest.raises(CommandError, match="1 file"):
        call_command("import_articles", str(tmp_path), stdout=StringIO(), stderr=err)
    assert "fr/gifts.md: " in err.getvalue() and "no article 'gifts' to translate" in err.getvalue()
    assert Article.objects.get(slug="returns-fr").translation_of.slug == "returns"


def test_articles_embedded_with_another_model_are_embedded_again_on_the_next_import(db):
    call_command("import_articles", str(DEMO_HELP_CENTER), stdout=StringIO())
    KnowledgeBase.objects.update(embedding_model="all-MiniLM-L6-v2")
    Chunk.objects.update(embedding=bytes(4 * EMBEDDING_DIM))
    assert services.embeddings_stale()
    said = StringIO()
    call_command("import_articles", str(DEMO_HELP_CENTER), stdout=said)
    assert "embedded again 144 articles" in said.getvalue()
    assert not services.embeddings_stale()
    assert not Chunk.objects.filter(embedding=bytes(4 * EMBEDDING_DIM)).exists()
