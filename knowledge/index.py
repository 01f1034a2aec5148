"""The process's retrieval index: every active article's passages and sentences, their
embeddings in two float32 matrices, and each language's lexicon (knowledge.terms).

Built from the database on first use and again whenever the knowledge-base version changes;
each process reads the version at most once per VERSION_CHECK_S (a web process twice as often,
in a thread of its own: `refresh`), so an edit made anywhere is searched everywhere within about
a second. The demo help center in four languages is about 300 passages and 850 sentences;
10,000 sentences of 384 dimensions are 15 MB and one matrix-vector product: numpy needs no
approximate index at this size.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from knowledge.embedding import EMBEDDING_DIM
from knowledge.facts import facts
from knowledge.models import Article, Chunk, KnowledgeBase, Sentence
from knowledge.terms import Lexicon, terms

VERSION_CHECK_S = 1.0


@dataclass(frozen=True, slots=True)
class IndexedArticle:
    slug: str
    title: str
    language: str
    # The slug of the original this one translates (its own slug for an original): the same
    # article in every language shares it.
    original: str


@dataclass(frozen=True, slots=True)
class IndexedChunk:
    article: int  # into KnowledgeIndex.articles
    heading: str
    text: str


@dataclass(frozen=True, slots=True)
class IndexedSentence:
    chunk: int  # into KnowledgeIndex.chunks
    position: int
    text: str
    terms: frozenset[str]  # with its article's title and its section's heading
    fact_kinds: frozenset[str]  # the kinds of the facts it states (knowledge.facts)


@dataclass
class KnowledgeIndex:
    version: int
    articles: list[IndexedArticle] = field(default_factory=list)
    chunks: list[IndexedChunk] = field(default_factory=list)
    sentences: list[IndexedSentence] = field(default_factory=list)
    chunk_matrix: np.ndarray = field(default_factory=lambda: np.zeros((0, EMBEDDING_DIM), np.float32))
    sentence_matrix: np.ndarray = field(default_factory=lambda: np.zeros((0, EMBEDDING_DIM), np.float32))
    # Per sentence: its chunk and its article (indexes), for scoring without Python loops.
    sentence_chunk: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    sentence_article: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    sentence_language: np.ndarray = field(default_factory=lambda: np.zeros(0, "<U2"))
    # Per kind of fact (knowledge.facts), which sentences state one.
    sentence_fact_kinds: dict[str, np.ndarray] = field(default_factory=dict)
    article_terms: list[frozenset[str]] = field(default_factory=list)
    lexicons: dict[str, Lexicon] = field(default_factory=dict)

    @property
    def languages(self) -> set[str]:
        return {article.language for article in self.articles}

    def article_of(self, sentence: int) -> IndexedArticle:
        return self.articles[int(self.sentence_article[sentence])]

    def chunk_of(self, sentence: int) -> IndexedChunk:
        return self.chunks[int(self.sentence_chunk[sentence])]


def knowledge_base_version() -> int:
    """The version of the one knowledge base (0 before anything was ever written to it)."""
    return KnowledgeBase.objects.values_list("version", flat=True).filter(pk=1).first() or 0


def _matrix(vectors: list[bytes]) -> np.ndarray:
    # A copy: numpy's own allocation is aligned for BLAS, a view into the joined bytes is not,
    # and a search over an unaligned matrix measured 20 times slower.
    return np.frombuffer(b"".join(vectors), dtype="<f4").reshape(len(vectors), EMBEDDING_DIM).copy()


def index_build() -> KnowledgeIndex:
    version = knowledge_base_version()
    index = KnowledgeIndex(version=version)
    active = Article.objects.filter(status=Article.Status.ACTIVE)
    article_at: dict[int, int] = {}
    for pk, slug, title, language, original in active.values_list(
        "pk", "slug", "title", "language", "translation_of__slug"
    ).order_by("pk"):
        article_at[pk] = len(index.articles)
        index.articles.append(IndexedArticle(slug, title, language, original or slug))
    chunk_at: dict[int, int] = {}
    chunk_vectors: list[bytes] = []
    for pk, article_id, heading, text, embedding in (
        Chunk.objects.filter(article__in=active)
        .order_by("article_id", "position")
        .values_list("pk", "article_id", "heading", "text", "embedding")
        .iterator(chunk_size=2000)
    ):
        chunk_at[pk] = len(index.chunks)
        index.chunks.append(IndexedChunk(article_at[article_id], heading, text))
        chunk_vectors.append(bytes(embedding))
    sentence_vectors: list[bytes] = []
    sentence_chunk: list[int] = []
    words_of_article: list[set[str]] = [set() for _ in index.articles]
    for chunk_id, position, text, embedding in (
        Sentence.objects.filter(chunk__article__in=active)
        .order_by("chunk_id", "position")
        .values_list("chunk_id", "position", "text", "embedding")
        .iterator(chunk_size=2000)
    ):
        chunk = chunk_at[chunk_id]
        article = index.chunks[chunk].article
        found = frozenset(terms(f"{index.articles[article].title} {index.chunks[chunk].heading} {text}"))
        kinds = frozenset(fact.kind for fact in facts(text))
        index.sentences.append(IndexedSentence(chunk, position, text, found, kinds))
        words_of_article[article] |= found
        sentence_vectors.append(bytes(embedding))
        sentence_chunk.append(chunk)
    if not index.sentences:
        return KnowledgeIndex(version=version)
    index.chunk_matrix = _matrix(chunk_vectors)
    index.sentence_matrix = _matrix(sentence_vectors)
    index.sentence_chunk = np.array(sentence_chunk, dtype=np.int64)
    index.sentence_article = np.array([index.chunks[c].article for c in sentence_chunk], dtype=np.int64)
    index.sentence_language = np.array(
        [index.articles[a].language for a in index.sentence_article], dtype="<U2"
    )
    kinds = {kind for sentence in index.sentences for kind in sentence.fact_kinds}
    index.sentence_fact_kinds = {
        kind: np.array([kind in sentence.fact_kinds for sentence in index.sentences]) for kind in kinds
    }
    index.article_terms = [frozenset(found) for found in words_of_article]
    for language in index.languages:
        index.lexicons[language] = Lexicon.build(
            found
            for article, found in zip(index.articles, words_of_article, strict=True)
            if article.language == language
        )
    return index


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
