"""The help center's embedding model: multilingual, checked before it loads, and light enough
for every web process (no torch)."""

import contextlib
import os
import sqlite3
import subprocess
import sys
import textwrap

import numpy as np
from django.conf import settings

from knowledge import embedding
from knowledge.embedding import embed_passages, embed_queries

PROGRAM = textwrap.dedent(
    """
    import sys

    import django

    django.setup()
    import config.asgi  # noqa: F401  (the web application and every view it routes to)
    import accounts.views, admin_console.urls, api.views, chat.views, knowledge.views  # noqa: F401, E401
    from knowledge.embedding import embed_passages, embed_queries

    passages = embed_passages(["Returns are accepted within 30 days.", "Shipping costs $5.95."])
    (question,) = embed_queries(["How long do I have to return an item?"])
    assert int((passages @ question).argmax()) == 0
    heavy = sorted(name for name in ("torch", "transformers", "sentence_transformers") if name in sys.modules)
    print("heavy:", heavy)
    """
)


def test_the_web_process_embeds_without_importing_torch():
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("heavy: []")


def test_a_question_in_any_of_the_four_languages_finds_the_english_passage_that_answers_it():
    passages = embed_passages(
        ["You can return most items within 30 days of delivery.", "Standard shipping costs $5.95."]
    )
    questions = [
        "How long do I have to return an item?",
        "Combien de temps ai-je pour retourner un article ?",
        "¿Cuánto tiempo tengo para devolver un artículo?",
        "Wie lange habe ich Zeit, einen Artikel zurückzugeben?",
    ]
    assert list((embed_queries(questions) @ passages.T).argmax(axis=1)) == [0, 0, 0, 0]
    assert np.allclose(np.linalg.norm(passages, axis=1), 1, atol=1e-4)


def test_model_files_other_than_the_pinned_ones_are_refused_before_they_load(monkeypatch):
    monkeypatch.setitem(embedding.FILE_SHA256, embedding.MODEL_FILE, "0" * 64)
    assert "is not the file pinned" in embedding.embedder_problem()


class _CountingModel:
    """The embedder's model, noting the passages it is asked to embed."""

    def __init__(self, model) -> None:
        self.model = model
        self.asked: list[str] = []

    def passage(self, texts: list[str]):
        self.asked += texts
        return self.model.passage(texts)


def _embedded_by_model(embedder: embedding.Embedder) -> list[str]:
    """The texts `embedder`'s model is asked to embed from now on."""
    embedder._model = _CountingModel(embedder._model)
    return embedder._model.asked


def test_text_embedded_once_is_read_back_by_another_embedder_and_only_new_text_is_embedded(tmp_path):
    store_path = tmp_path / "embeddings.sqlite3"
    returns, shipping, new = (
        "Returns are accepted within 30 days.",
        "Shipping costs $5.95.",
        "We ship to Canada.",
    )
    embedding.Embedder(embedding.PassageStore(store_path)).passages([returns, shipping])

    again = embedding.Embedder(embedding.PassageStore(store_path))
    asked = _embedded_by_model(again)
    vectors = again.passages([shipping, new, returns, shipping])

    assert asked == [new]
    alone = embedding.Embedder().passages([shipping, new, returns, shipping])
    assert np.allclose(vectors, alone, atol=1e-5)


def test_a_store_that_cannot_be_opened_or_is_damaged_is_passed_over_and_every_text_embedded(tmp_path, caplog):
    (tmp_path / "a-file").write_text("not a folder")
    damaged = tmp_path / "damaged.sqlite3"
    damaged.write_bytes(b"not a database" * 100)
    texts = ["Returns are accepted within 30 days.", "Shipping costs $5.95."]
    alone = embedding.Embedder().passages(texts)

    for path in (tmp_path / "a-file" / "embeddings.sqlite3", damaged):
        vectors = embedding.Embedder(embedding.PassageStore(path)).passages(texts)
        assert np.allclose(vectors, alone, atol=1e-5)
    assert caplog.text.count("passed over, embedding instead") == 2


def test_a_locked_store_is_passed_over_for_that_call_only(tmp_path, monkeypatch):
    store = embedding.PassageStore(tmp_path / "embeddings.sqlite3")
    monkeypatch.setattr(embedding.PassageStore, "BUSY_TIMEOUT_S", 0.1)
    embedder = embedding.Embedder(store)
    asked = _embedded_by_model(embedder)
    with contextlib.closing(sqlite3.connect(store.path, isolation_level=None)) as other_process:
        other_process.execute(
            "CREATE TABLE IF NOT EXISTS passage (key BLOB PRIMARY KEY, vector BLOB NOT NULL)"
        )
        other_process.execute("BEGIN EXCLUSIVE")
        embedder.passages(["Returns are accepted within 30 days."])  # neither read nor written
        other_process.execute("COMMIT")

    embedder.passages(["Returns are accepted within 30 days."])  # written now
    embedder.passages(["Returns are accepted within 30 days."])  # and read back

    assert asked == ["Returns are accepted within 30 days."] * 2
