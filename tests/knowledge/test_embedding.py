"""The help center's embedding model: multilingual, checked before it loads, and light enough
for every web process (no torch)."""

import os
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


def test_text_embedded_once_is_read_back_by_another_embedder_without_the_model(tmp_path):
    store = embedding.PassageStore(tmp_path / "embeddings.sqlite3")
    texts = ["Returns are accepted within 30 days.", "Shipping costs $5.95."]
    first = embedding.Embedder(store).passages(texts)

    again = embedding.Embedder(embedding.PassageStore(store.path))
    again._model = None  # any text not in the store would fail here
    assert np.array_equal(again.passages([texts[1], texts[0], texts[1]]), first[[1, 0, 1]])


def test_an_unusable_store_is_left_out_and_every_text_is_embedded(tmp_path, caplog):
    (tmp_path / "a-file").write_text("not a folder")
    unusable = embedding.PassageStore(tmp_path / "a-file" / "embeddings.sqlite3")

    vectors = embedding.Embedder(unusable).passages(["Returns are accepted within 30 days."])

    assert vectors.shape == (1, embedding.EMBEDDING_DIM)
    assert "left out, embedding again" in caplog.text
