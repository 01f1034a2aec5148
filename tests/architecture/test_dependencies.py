"""The dependency rule of docs/ARCHITECTURE.md, checked on the source: the traffic layer
(`scheduler`) and the worker (`inference`) import no web app (`accounts`, `api`, `chat`, `admin_console`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WEB_APPS = {"accounts", "api", "chat", "admin_console"}


def _imported_packages(path: Path) -> set[str]:
    """The top-level packages a module imports, wherever the import statement stands."""
    packages = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            packages.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            packages.add(node.module.partition(".")[0])
    return packages


@pytest.mark.parametrize("app", ["scheduler", "inference"])
def test_the_traffic_layer_and_the_worker_import_no_web_app(app):
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imported_packages(path) & WEB_APPS)
        for path in sorted((ROOT / app).rglob("*.py"))
    }
    assert {path: apps for path, apps in offenders.items() if apps} == {}


def test_the_check_sees_an_import_of_a_web_app(tmp_path):
    module = tmp_path / "module.py"
    module.write_text("def f():\n    from chat.models import Message\n")
    assert "chat" in _imported_packages(module)
