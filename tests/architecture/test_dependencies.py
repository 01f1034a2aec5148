"""The dependency picture of docs/ARCHITECTURE.md ("Apps"), checked on the source: each app
imports only the apps below it, so the traffic layer (`scheduler`) imports no other app and the
worker (`inference`) only the traffic layer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What each app may import besides itself and the project's `config`; keep in step with
# docs/ARCHITECTURE.md.
ALLOWED = {
    "scheduler": set(),
    "inference": {"knowledge", "scheduler"},
    "accounts": {"scheduler"},
    "knowledge": {"scheduler"},
    "chat": {"accounts", "knowledge", "scheduler"},
    "api": {"accounts", "chat", "knowledge", "scheduler"},
    "admin_console": {"accounts", "api", "chat", "knowledge", "scheduler"},
}


def _imported_packages(path: Path) -> set[str]:
    """The top-level packages a module imports, wherever the import statement stands."""
    packages = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            packages.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            packages.add(node.module.partition(".")[0])
    return packages


@pytest.mark.parametrize("app", sorted(ALLOWED))
def test_each_app_imports_only_the_apps_below_it(app):
    forbidden = set(ALLOWED) - ALLOWED[app] - {app}
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imported_packages(path) & forbidden)
        for path in sorted((ROOT / app).rglob("*.py"))
    }
    assert {path: apps for path, apps in offenders.items() if apps} == {}


def test_the_picture_has_no_cycle():
    def below(app: str) -> set[str]:
        return set().union(*({dep, *below(dep)} for dep in ALLOWED[app])) if ALLOWED[app] else set()

    assert all(app not in below(app) for app in ALLOWED)


def test_the_check_sees_an_import_of_another_app(tmp_path):
    module = tmp_path / "module.py"
    module.write_text("def f():\n    from chat.models import Message\n")
    assert "chat" in _imported_packages(module)
