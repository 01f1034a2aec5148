"""`python -m bench retrieval`: how long the web process takes to find a question's excerpts.

A private SQLite database gets the demo help center (real articles, really embedded) and
filler chunks up to the size asked for. The filler rows are random unit vectors: a search
multiplies the whole matrix by the question whatever its values, so they cost what real
chunks cost, without minutes of embedding. Each query is timed through
knowledge.selectors.help_center_excerpts, the call chat prompts make: embed the question with
onnxruntime, check the knowledge-base version (at most once a second), search, pick excerpts.
"""

from __future__ import annotations

import os
import tempfile
import time
from io import StringIO
from pathlib import Path

import numpy as np

from bench.stats import percentile

QUESTIONS = [
    "How long do I have to return an item?",
    "When will my package arrive?",
    "How much does express shipping cost?",
    "Can I pay with PayPal?",
    "I forgot my password, what do I do?",
    "Do you ship to Germany?",
    "How do I cancel my order?",
    "Where is my refund?",
    "My lamp stopped working after a year, is it under warranty?",
    "Can I change the delivery address?",
    "Do gift cards expire?",
    "How do I delete my account?",
    "What is the capital of France?",
    "Tell me a joke",
]


def _database(workdir: Path) -> None:
    os.environ["DATABASE_URL"] = f"sqlite:///{workdir / 'bench.sqlite3'}"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "--no-input", verbosity=0)
    demo = Path(__file__).resolve().parent.parent / "knowledge" / "demo_help_center"
    call_command("import_articles", str(demo), stdout=StringIO())


def _fill(total_chunks: int) -> int:
    """Add random unit-vector chunks until the index holds `total_chunks`; returns the real ones."""
    from django.db.models import F

    from knowledge.embedding import EMBEDDING_DIM
    from knowledge.models import Article, Chunk, KnowledgeBase

    real = Chunk.objects.count()
    filler = Article.objects.create(slug="filler", title="Filler", body="Filler.")
    rng = np.random.default_rng(7)
    for start in range(0, max(total_chunks - real, 0), 2000):
        count = min(2000, total_chunks - real - start)
        vectors = rng.standard_normal((count, EMBEDDING_DIM)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        Chunk.objects.bulk_create(
            Chunk(article=filler, position=start + i, text="filler", embedding=vector.tobytes())
            for i, vector in enumerate(vectors)
        )
    KnowledgeBase.objects.filter(pk=1).update(version=F("version") + 1)
    return real


def retrieval(*, chunks: int, queries: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-retrieval-") as workdir:
        _database(Path(workdir))
        real = _fill(chunks)
        from knowledge.index import current_index, index_build
        from knowledge.selectors import help_center_excerpts

        started = time.perf_counter()
        index = index_build()
        build_s = time.perf_counter() - started
        help_center_excerpts(question="warm-up")  # loads the ONNX session and the index
        latencies_ms: list[float] = []
        answered = 0
        for n in range(queries):
            question = QUESTIONS[n % len(QUESTIONS)]
            started = time.perf_counter()
            found = help_center_excerpts(question=question)
            latencies_ms.append((time.perf_counter() - started) * 1000)
            answered += bool(found.excerpts)
        current_index.forget()
    return {
        "chunks": len(index.chunks),
        "real_chunks": real,
        "queries": queries,
        "answered_queries": answered,
        "index_build_s": round(build_s, 3),
        "latency_ms": {
            "p50": round(percentile(latencies_ms, 50) or 0, 2),
            "p99": round(percentile(latencies_ms, 99) or 0, 2),
            "max": round(max(latencies_ms), 2),
        },
    }
