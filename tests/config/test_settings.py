"""Settings a deployment depends on: no published secret key, and HTTPS hardening that
`manage.py check --deploy` accepts with the production environment the README documents."""

import re
import secrets
import subprocess
import sys
from pathlib import Path

from launcher.process import ROOT
from launcher.stack import inherited_env as child_env

PRODUCTION_ENV = ROOT / "deploy" / "production.env"


def _manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _production_env() -> dict[str, str]:
    values = {}
    for line in PRODUCTION_ENV.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            values[name] = value
    return values


def _without_secret_key(tmp_path: Path, **overrides: str) -> dict[str, str]:
    env = child_env(**{"DJANGO_SECRET_KEY_FILE": str(tmp_path / "no-such-file"), **overrides})
    env.pop("DJANGO_SECRET_KEY", None)
    env.pop("DJANGO_DEBUG", None)
    return env


def test_without_a_secret_key_the_product_refuses_to_start_and_says_what_to_set(tmp_path):
    result = _manage("check", env=_without_secret_key(tmp_path))
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert "set DJANGO_SECRET_KEY" in result.stderr


def test_a_key_file_is_enough(tmp_path):
    key_file = tmp_path / "secret_key"
    key_file.write_text(secrets.token_urlsafe(50) + "\n")
    env = _without_secret_key(tmp_path, DJANGO_SECRET_KEY_FILE=str(key_file))
    assert _manage("check", env=env).returncode == 0


def test_the_documented_production_environment_passes_the_deployment_check(tmp_path):
    production = _production_env()
    assert production.pop("DJANGO_SECRET_KEY") == "", "the example must not ship a usable key"
    env = _without_secret_key(tmp_path, **production)
    env["DJANGO_SECRET_KEY"] = secrets.token_urlsafe(50)
    result = _manage("check", "--deploy", "--fail-level", "WARNING", env=env)
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr + result.stdout
    assert "no issues" in result.stdout


def test_the_readme_shows_the_production_environment_as_it_is():
    readme = (ROOT / "README.md").read_text()
    settings = re.findall(r"^[A-Z_]+=.*$", PRODUCTION_ENV.read_text(), flags=re.MULTILINE)
    assert settings
    for line in settings:
        assert line in readme
