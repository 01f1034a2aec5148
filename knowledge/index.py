"""The process's retrieval index: every active chunk's embedding in one float32 matrix.

Built from the database on first use and again whenever the knowledge-base version changes;
each process reads the version at most once per VERSION_CHECK_S (a web process twice as often,
in a thread of its own: `refresh`), so an edit made anywhere is searched everywhere within about
a second. 10,000 chunks of 384 dimensions are 15 MB and one
matrix-vector product: numpy needs no approximate index at this size.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from knowledge.embedding import EMBEDDING_DIM
from knowledge.models import Article, Chunk, KnowledgeBase

VERSION_CHECK_S = 1.0


@dataclass(frozen=True, slots=True)
class IndexedChunk:
    slug: str
    title: str
    heading: str
    text: str


@dataclass(frozen=True, slots=True)
class Hit:
    chunk: IndexedChunk
    score: float  # cosine similarity with the question


class KnowledgeIndex:
    def __init__(self, *, version: int, chunks: list[IndexedChunk], matrix: np.ndarray) -> None:
        self.version = version
        self.chunks = chunks
        self.matrix = matrix

    @classmethod
    def empty(cls, version: int) -> KnowledgeIndex:
        return cls(version=version, chunks=[], matrix=np.zeros((0, EMBEDDING_DIM), dtype=np.float32))

    def search(self, query: np.ndarray, *, limit: int, min_score: float) -> list[Hit]:
        """The `limit` best chunks scoring at least `min_score`, best first."""
        if not self.chunks or limit <= 0:
            return []
        # einsum's own loop, not BLAS: OpenBLAS's threads for a matrix-vector product this small
        # fight onnxruntime and the other requests for the cores, and made the p99 of a whole
        # retrieval (embed + search) 5 times longer in `python -m bench retrieval`.
        scores = np.einsum("ij,j->i", self.matrix, query)
        best = np.argpartition(scores, -limit)[-limit:] if len(scores) > limit else np.arange(len(scores))
        best = best[np.argsort(scores[best])[::-1]]
        return [Hit(self.chunks[i], float(scores[i])) for i in best if scores[i] >= min_score]


def knowledge_base_version() -> int:
    """The version of the one knowledge base (0 before anything was ever written to it)."""
    return KnowledgeBase.objects.values_list("version", flat=True).filter(pk=1).first() or 0


def index_build() -> KnowledgeIndex:
    version = knowledge_base_version()
    rows = Chunk.objects.filter(article__status=Article.Status.ACTIVE).values_list(
        "article__slug", "article__title", "heading", "text", "embedding"
    )
    chunks: list[IndexedChunk] = []
    vectors: list[bytes] = []
    for slug, title, heading, text, embedding in rows.iterator(chunk_size=2000):
        chunks.append(IndexedChunk(slug, title, heading, text))
        vectors.append(bytes(embedding))
    if not chunks:
        return KnowledgeIndex.empty(version)
    # A copy: numpy's own allocation is aligned for BLAS, a view into the joined bytes is not,
    # and a search over an unaligned matrix measured 20 times slower.
    matrix = np.frombuffer(b"".join(vectors), dtype="<f4").reshape(len(chunks), EMBEDDING_DIM).copy()
    return KnowledgeIndex(version=version, chunks=chunks, matrix=matrix)


class _CurrentIndex:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._index: KnowledgeIndex | None = None
        self._checked_at = 0.0

    def get(self, *, max_age_s: float = VERSION_CHECK_S) -> KnowledgeIndex:
        """The index of the knowledge base's version as read at most `max_age_s` ago."""
        now = time.monotonic()
        index = self._index
        if index is not None and now - self._checked_at < max_age_s:
            return index
        with self._lock:
            if self._index is None or knowledge_base_version() != self._index.version:
                self._index = index_build()
            self._checked_at = time.monotonic()
            return self._index

    def refresh(self) -> None:
        """Read the version again, and build the index of a new one, whatever the age: a web
        process does it twice a second (config.startup.hot_reads_keep_fresh), so that a post
        neither reads the version nor waits for an index of a changed help center."""
        self.get(max_age_s=0)

    def forget(self) -> None:
        """The next search reads the database again (tests, and a process that just wrote)."""
        with self._lock:
            self._index = None


current_index = _CurrentIndex()
