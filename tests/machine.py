"""Pytest plugin: what each marked group of tests needs from the machine, checked once the
tests are chosen and before any runs.

Without it every test of the group would fail on the same missing piece; the run stops instead
with one line per group that says what is missing and how to leave the group out. A failure,
not a skip: a skip would let `make test` pass on a machine that cannot run them.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from django.conf import settings

from inference.model_prep import missing_model_files
from launcher.postgres import postgres_bindir

CHROMIUM = Path("/usr/bin/chromium")


def _vllm_missing() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (make install-vllm)"
    model = settings.INFERENCE_MODEL
    missing = missing_model_files(Path(model))
    if missing:
        return f"the model is not prepared, {model} lacks {', '.join(missing)} (make model)"
    return None


def _chromium_missing() -> str | None:
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing (apt-get install chromium)"
    return None


def _multihost_missing() -> str | None:
    if os.geteuid() != 0:
        return "it needs root (its hosts are network namespaces)"
    for tool in ("ip", "nginx", "redis-server", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install iproute2 nginx redis-server util-linux)"
    try:
        postgres_bindir()
    except RuntimeError as exc:
        return str(exc)
    return None


NEEDS: dict[str, Callable[[], str | None]] = {
    "vllm": _vllm_missing,
    "browser": _chromium_missing,
    "multihost": _multihost_missing,
}


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    chosen = [{mark.name for mark in item.iter_markers()} for item in session.items]
    unmet = []
    for marker, missing in NEEDS.items():
        count = sum(marker in markers for markers in chosen)
        reason = missing() if count else None
        if reason:
            unmet.append(
                f"the {count} {marker} tests cannot run: {reason}; leave them out with "
                f'`python manage.py test --exclude-tag {marker}` or `pytest -m "not {marker}"`'
            )
    if unmet:
        raise pytest.UsageError("\n".join(unmet))
