"""The web process embeds questions with onnxruntime: importing it, the console, the chat and
running retrieval must not import torch (half a gigabyte and seconds per process)."""

import os
import subprocess
import sys
import textwrap

from django.conf import settings

PROGRAM = textwrap.dedent(
    """
    import sys

    import django
    import numpy as np

    django.setup()
    import config.asgi  # noqa: F401  (the web application and every view it routes to)
    import accounts.views, admin_console.views, api.views, chat.views, knowledge.views  # noqa: F401, E401
    from knowledge.embedding import embed
    from knowledge.index import IndexedChunk, KnowledgeIndex

    vectors = embed(["Returns are accepted within 30 days.", "Shipping costs $5.95."])
    chunks = [IndexedChunk("returns", "Returns", "", ""), IndexedChunk("shipping", "Shipping", "", "")]
    index = KnowledgeIndex(version=1, chunks=chunks, matrix=vectors)
    (question,) = embed(["How long do I have to return an item?"])
    hits = index.search(question, limit=1, min_score=0.3)
    assert [hit.chunk.slug for hit in hits] == ["returns"], hits
    heavy = sorted(name for name in ("torch", "transformers", "sentence_transformers") if name in sys.modules)
    print("heavy:", heavy)
    """
)


def test_the_web_process_retrieves_without_importing_torch():
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
