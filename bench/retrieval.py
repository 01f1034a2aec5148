"""`python -m bench retrieval`: how long the web process takes to answer a question from the
help center without a model (the extractive style), or to find a model's excerpts.

A private SQLite database gets the demo help center (real articles in four languages, really
embedded) and filler sentences up to the size asked for. The filler rows are random unit
vectors: a search multiplies the whole matrix by the question whatever its values, so they cost
what real sentences cost, without minutes of embedding. Each query is timed through
knowledge.answers.answer_plan, the call a chat post makes: embed the question (multilingual e5),
check the knowledge-base version (at most once a second), rank the sentences, decide whether
the help center answers, and quote it.
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


def _fill(total_sentences: int) -> int:
    """Add random unit-vector sentences (one passage each) until the index holds
    `total_sentences`; returns the real ones."""
    from django.db.models import F

    from knowledge.embedding import EMBEDDING_DIM
    from knowledge.models import Article, Chunk, KnowledgeBase, Sentence

    real = Sentence.objects.count()
    filler = Article.objects.create(slug="filler", title="Filler", body="Filler.")
    rng = np.random.default_rng(7)
    for start in range(0, max(total_sentences - real, 0), 2000):
        count = min(2000, total_sentences - real - start)
        vectors = rng.standard_normal((count, EMBEDDING_DIM)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        chunks = Chunk.objects.bulk_create(
            Chunk(article=filler, position=start + i, text="filler", embedding=vector.tobytes())
            for i, vector in enumerate(vectors)
        )
        Sentence.objects.bulk_create(
            Sentence(chunk=chunk, position=0, text="filler", embedding=vector.tobytes())
            for chunk, vector in zip(chunks, vectors, strict=True)
        )
    KnowledgeBase.objects.filter(pk=1).update(version=F("version") + 1)
    return real


def retrieval(*, sentences: int, queries: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-retrieval-") as workdir:
        _database(Path(workdir))
        real = _fill(sentences)
        from knowledge.answers import answer_plan
        from knowledge.index import current_index, index_build
        from scheduler.models import Variant

        variant = Variant(name="bench", model="-", system_prompt="", temperature=0, top_p=1, max_tokens=1)
        started = time.perf_counter()
        index = index_build()
        build_s = time.perf_counter() - started
        answer_plan(variant=variant, message="warm-up")  # loads the embedding model and the index
        latencies_ms: list[float] = []
        answered = 0
        for n in range(queries):
            question = QUESTIONS[n % len(QUESTIONS)]
            started = time.perf_counter()
            plan = answer_plan(variant=variant, message=question)
            latencies_ms.append((time.perf_counter() - started) * 1000)
            answered += not plan.declined
        current_index.forget()
    return {
        "sentences": len(index.sentences),
        "real_sentences": real,
        "queries": queries,
        "answered_queries": answered,
        "index_build_s": round(build_s, 3),
        "latency_ms": {
            "p50": round(percentile(latencies_ms, 50) or 0, 2),
            "p99": round(percentile(latencies_ms, 99) or 0, 2),
            "max": round(max(latencies_ms), 2),
        },
    }
