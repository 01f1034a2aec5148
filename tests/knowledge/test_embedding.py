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
