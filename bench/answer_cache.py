"""`python -m bench cache`: what the result cache adds to a question it cannot answer, and how
its similarity threshold treats paraphrases and near-misses.

A private SQLite database gets `--entries` cached questions of one variant (random unit
vectors: the semantic match multiplies the whole matrix by the question whatever its values,
so they cost what real entries cost) and the demo questions' real embeddings. Each miss is
timed through knowledge.cache.answer_lookup, the call chat makes with the vector retrieval
already computed: the once-a-second check for new entries, the exact match, the semantic
match. The API's lookup (greedy or seeded calls only) matches the text alone, with no vector
and no embedding; that is timed apart. After a miss is
admitted, the question is remembered (one transaction on the database), timed apart too.

The hit rate: `--askers` distinct customers each ask one first question, drawn from the
paraphrase pairs below (a few questions asked often, most seldom; the first wording more often
than the second, and sometimes retyped in lower case without its question mark, the same text
to the cache); every miss is answered and remembered. Counted once with the rule before
ANSWER_CACHE_SHARE_AFTER (an answer answers paraphrases at once: 1) and once with the setting.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from bench.retrieval import QUESTIONS
from bench.stats import percentile

# Pairs a cache must tell apart: the same question reworded (should hit), and questions that
# differ in what they ask (must not).
PARAPHRASES = [
    ("How do I return an item?", "How can I return something I bought?"),
    ("How long does delivery take?", "How many days until my parcel arrives?"),
    ("Can I cancel my order?", "Is it possible to cancel an order?"),
    ("Do gift cards expire?", "Is there an expiry date on gift cards?"),
    ("What payment methods do you accept?", "Which ways can I pay?"),
    ("how do i reset my password", "I forgot my password, how do I reset it?"),
    ("Do you ship internationally?", "Can you deliver abroad?"),
    ("What is your refund policy?", "How do refunds work?"),
    ("How do I change my delivery address?", "Can I update the shipping address?"),
    ("Where is my order?", "Where's my order?"),
]
NEAR_MISSES = [
    ("How do I return an item?", "How do I exchange an item?"),
    ("Can I cancel my order?", "Can I change my order?"),
    ("Do gift cards expire?", "Can gift cards be refunded?"),
    ("How long does delivery take?", "How much does delivery cost?"),
    ("Do you ship to Canada?", "Do you ship to Mexico?"),
    ("How do I reset my password?", "How do I change my email address?"),
    ("What is your refund policy?", "What is your return policy?"),
    ("Can I pay with PayPal?", "Can I pay with Apple Pay?"),
    ("How do I open an account?", "How do I close my account?"),
    ("Is express delivery available?", "Is free delivery available?"),
    ("Can I return sale items?", "Can I return used items?"),
    ("How do I track my parcel?", "How do I return my parcel?"),
]


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 50) or 0, 3),
        "p99": round(percentile(values, 99) or 0, 3),
        "max": round(max(values), 3),
    }


def _threshold_table() -> dict:
    from django.conf import settings

    from knowledge.embedding import embed_queries as embed

    def similarities(pairs: list[tuple[str, str]]) -> np.ndarray:
        return np.einsum("ij,ij->i", embed([a for a, _ in pairs]), embed([b for _, b in pairs]))

    paraphrase, near = similarities(PARAPHRASES), similarities(NEAR_MISSES)
    rows = {
        f"{threshold:.2f}": {
            "paraphrases_hit": int((paraphrase >= threshold).sum()),
            "near_misses_hit": int((near >= threshold).sum()),
        }
        for threshold in (0.90, 0.92, 0.94, 0.95, 0.96, 0.97)
    }
    return {
        "threshold": settings.ANSWER_CACHE_MIN_SIMILARITY,
        "paraphrases": len(PARAPHRASES),
        "near_misses": len(NEAR_MISSES),
        "highest_near_miss": round(float(near.max()), 3),
        "by_threshold": rows,
    }


def _hit_rate(*, variant: str, context: str, askers: int, share_after: int) -> dict:
    """Hits, exact and semantic, over a stream of `askers` distinct customers' first questions."""
    from django.test import override_settings

    from knowledge import cache
    from knowledge.embedding import embed_queries
    from knowledge.index import knowledge_base_version
    from scheduler.models import Generation

    rng = np.random.default_rng(11)
    popularity = 1 / np.arange(1, len(PARAPHRASES) + 1)  # Zipf: the first questions most asked
    popularity /= popularity.sum()
    wordings = [wording for pair in PARAPHRASES for wording in pair]
    vectors = dict(zip(wordings, embed_queries(wordings), strict=True))
    version = knowledge_base_version()
    results = {"exact": 0, "semantic": 0, "miss": 0}
    hit_ms: list[float] = []  # a hit's lookup, with counting its customer until it is shared
    with override_settings(ANSWER_CACHE_SHARE_AFTER=share_after):
        for n in range(askers):
            first, second = PARAPHRASES[rng.choice(len(PARAPHRASES), p=popularity)]
            draw = rng.random()
            wording = first if draw < 0.6 else second if draw < 0.9 else first.lower().rstrip("?")
            customer = cache.customer_key(client_id=f"user:{n}")
            vector = vectors.get(wording, vectors[first])
            started = time.perf_counter()
            found = cache.answer_lookup(
                variant=variant, context=context, question=wording, vector=vector, customer=customer
            )
            if found.answer is not None:
                hit_ms.append((time.perf_counter() - started) * 1000)
                results[str(found.answer.cache)] += 1
                continue
            results["miss"] += 1
            request_id = str(uuid.uuid4())
            Generation.objects.create(
                request_id=request_id,
                origin="chat",
                variant=variant,
                tier="normal",
                status=Generation.Status.DONE,
                finish_reason="stop",
                text=f"An answer to: {wording}",
            )
            cache.answer_remember(
                variant=variant,
                context=context,
                question=wording,
                vector=vector,
                kb_version=version,
                help_center=False,
                source_slugs=[],
                request_id=request_id,
                customer=customer,
            )
    hits = results["exact"] + results["semantic"]
    return {
        "share_after": share_after,
        "askers": askers,
        **results,
        "hit_rate": round(hits / askers, 3),
        "hit_lookup_ms": _ms(hit_ms),
    }


def answer_cache(*, entries: int, queries: int, askers: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as workdir:
        os.environ["DATABASE_URL"] = f"sqlite:///{Path(workdir) / 'bench.sqlite3'}"
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", "--no-input", verbosity=0)
        from django.conf import settings

        from knowledge import cache
        from knowledge.embedding import EMBEDDING_DIM
        from knowledge.embedding import embed_queries as embed
        from knowledge.index import knowledge_base_version
        from knowledge.models import CachedAnswer
        from scheduler.models import Variant

        variant = Variant.objects.get(name="stable")
        context = cache.chat_context(variant)
        rng = np.random.default_rng(7)
        version = knowledge_base_version()
        for start in range(0, entries, 2000):
            vectors = rng.standard_normal((min(2000, entries - start), EMBEDDING_DIM)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            CachedAnswer.objects.bulk_create(
                CachedAnswer(
                    variant=variant.name,
                    context=context,
                    question=f"filler {start + i}",
                    question_hash=uuid.uuid4().hex,
                    embedding=vector.tobytes(),
                    kb_version=version,
                )
                for i, vector in enumerate(vectors)
            )
        vectors = dict(zip(QUESTIONS, embed(QUESTIONS), strict=True))
        customer = cache.customer_key(client_id="user:1")
        cache.answer_lookup(
            variant=variant.name,
            context=context,
            question="warm-up",
            vector=vectors[QUESTIONS[0]],
            customer=customer,
        )
        chat_ms: list[float] = []
        api_ms: list[float] = []
        remember_ms: list[float] = []
        hits = 0
        for n in range(queries):
            question = QUESTIONS[n % len(QUESTIONS)]
            started = time.perf_counter()
            found = cache.answer_lookup(
                variant=variant.name,
                context=context,
                question=question,
                vector=vectors[question],
                customer=customer,
            )
            chat_ms.append((time.perf_counter() - started) * 1000)
            hits += found.answer is not None
            started = time.perf_counter()
            cache.answer_lookup(
                variant=variant.name, context=context, question=question, vector=None, customer=customer
            )
            api_ms.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            cache.answer_remember(
                variant=variant.name,
                context=context,
                question=f"{question} ({n})",
                vector=vectors[question],
                kb_version=version,
                help_center=variant.knowledge,
                source_slugs=[],
                request_id=str(uuid.uuid4()),
                customer=customer,
            )
            remember_ms.append((time.perf_counter() - started) * 1000)
        cache._index.forget()
        hit_rates = [
            _hit_rate(
                variant=variant.name,
                context=f"hit-rate-{share_after}",
                askers=askers,
                share_after=share_after,
            )
            for share_after in sorted({1, settings.ANSWER_CACHE_SHARE_AFTER})
        ]
        cache._index.forget()
        return {
            "entries": entries,
            "hit_rates": hit_rates,
            "queries": queries,
            "hits": hits,
            "miss_lookup_ms": _ms(chat_ms),
            "miss_lookup_exact_ms": _ms(api_ms),
            "miss_remember_ms": _ms(remember_ms),
            "similarity": _threshold_table(),
        }
