"""Sentence embeddings with all-MiniLM-L6-v2, exported to ONNX by `manage.py prepare_embedder`.

The web process embeds with onnxruntime and the `tokenizers` library only: importing torch
there would add about 0.5 GB to every web process and seconds to its start.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnxruntime
from django.conf import settings
from tokenizers import Tokenizer

EMBEDDING_DIM = 384
MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
# The model was trained on passages up to 256 word pieces (sentence_bert_config.json).
MAX_TOKENS = 256
BATCH_SIZE = 32


class EmbedderUnavailable(RuntimeError):
    """The ONNX model folder is missing or incomplete; run `manage.py prepare_embedder`."""


def missing_embedder_files(path: Path) -> list[str]:
    return [name for name in (MODEL_FILE, TOKENIZER_FILE) if not (path / name).is_file()]


class Embedder:
    """Text -> unit-length float32 vectors (mean pooling and normalisation are in the graph)."""

    def __init__(self, path: Path) -> None:
        missing = missing_embedder_files(path)
        if missing:
            raise EmbedderUnavailable(
                f"No embedding model at {path} (missing: {', '.join(missing)}); "
                "run `python manage.py prepare_embedder`"
            )
        options = onnxruntime.SessionOptions()
        # One question at a time is a few milliseconds on one core; more threads only contend
        # with the other requests this process serves.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = onnxruntime.InferenceSession(
            str(path / MODEL_FILE), options, providers=["CPUExecutionProvider"]
        )
        self._tokenizer = Tokenizer.from_file(str(path / TOKENIZER_FILE))
        self._tokenizer.enable_truncation(MAX_TOKENS)
        self._tokenizer.enable_padding()

    def embed(self, texts: list[str]) -> np.ndarray:
        """An (n, EMBEDDING_DIM) float32 matrix, one unit-length row per text."""
        rows = [self._embed_batch(texts[i : i + BATCH_SIZE]) for i in range(0, len(texts), BATCH_SIZE)]
        return np.concatenate(rows) if rows else np.zeros((0, EMBEDDING_DIM), dtype=np.float32)

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        encodings = self._tokenizer.encode_batch(texts)
        input_ids = np.array([e.ids for e in encodings], dtype=np.int64)
        attention_mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        (embeddings,) = self._session.run(
            None,
            {
                "input_ids": input_ids,
                "attention_mask": attention_mask,
                "token_type_ids": np.zeros_like(input_ids),
            },
        )
        return np.ascontiguousarray(embeddings, dtype=np.float32)


_embedder: Embedder | None = None
_embedder_lock = threading.Lock()


def embedder() -> Embedder:
    """The process's embedder, loaded on first use (about 0.3 s)."""
    global _embedder
    if _embedder is None:
        with _embedder_lock:
            if _embedder is None:
                _embedder = Embedder(settings.KNOWLEDGE_EMBEDDING_MODEL)
    return _embedder


def embed(texts: list[str]) -> np.ndarray:
    return embedder().embed(texts)
