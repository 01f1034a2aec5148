"""`python manage.py test`: Django's test command runs the suite with pytest, as `make test` does.

pytest runs in a fresh interpreter. The suite starts its own Redis and database and sets the
environment before Django reads its settings (tests/redis_plugin.py, tests/database_plugin.py);
by the time Django calls a test runner, this process has read them already, from the caller's
environment, where REDIS_URL may name the machine's own Redis.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

from django.conf import settings


def markers() -> list[str]:
    """The pytest markers the suite declares (pyproject.toml): `--tag` and `--exclude-tag` take them."""
    with (Path(settings.BASE_DIR) / "pyproject.toml").open("rb") as pyproject:
        declared = tomllib.load(pyproject)["tool"]["pytest"]["ini_options"]["markers"]
    return [line.split(":", 1)[0] for line in declared]


def pytest_target(label: str, base_dir: Path) -> str:
    """A Django test label as pytest names the same tests: `tests.knowledge` is the folder
    tests/knowledge, `tests.scheduler.test_rate_limits.test_name` the test `test_name` in
    tests/scheduler/test_rate_limits.py, an app (`chat`) its tests (tests/chat). A path or a
    pytest node id is kept as it is."""
    if "/" in label or "::" in label or label.endswith(".py"):
        return label
    parts = label.split(".")
    if parts[0] != "tests" and (base_dir / "tests" / parts[0]).is_dir():
        parts.insert(0, "tests")
    for end in range(len(parts), 0, -1):
        path = Path(*parts[:end])
        if (base_dir / path.with_suffix(".py")).is_file():
            return "::".join([f"{path}.py", *parts[end:]])
        if end == len(parts) and (base_dir / path).is_dir():
            return str(path)
    return label  # pytest says it finds no such file or folder


class NotSupported(argparse.Action):
    """An option of Django's own runner that this one refuses, saying why (its help)."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is not supported: {self.help}")


class PytestRunner:
    """Django's labels and options as pytest arguments; the command exits 1 when pytest does
    not exit 0 (a test failed, or none was chosen, or pytest refused the run)."""

    def __init__(
        self,
        *,
        verbosity: int = 1,
        failfast: bool = False,
        tags: list[str] | None = None,
        exclude_tags: list[str] | None = None,
        test_name_patterns: list[str] | None = None,
        database: str = "sqlite",
        **_options: object,  # the command's own (interactive, testrunner, settings...)
    ) -> None:
        self.verbosity = verbosity
        self.failfast = failfast
        self.tags = tags or []
        self.exclude_tags = exclude_tags or []
        self.test_name_patterns = test_name_patterns or []
        self.database = database

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        tags = markers()
        names = ", ".join(tags)
        parser.add_argument(
            "--tag",
            action="append",
            dest="tags",
            choices=tags,
            metavar="TAG",
            help=f"run only the tests with this pytest marker ({names}); may be repeated",
        )
        parser.add_argument(
            "--exclude-tag",
            action="append",
            dest="exclude_tags",
            choices=tags,
            metavar="TAG",
            help=f"leave out the tests with this pytest marker ({names}); may be repeated",
        )
        parser.add_argument("--failfast", action="store_true", help="stop at the first failing test")
        parser.add_argument(
            "-k",
            action="append",
            dest="test_name_patterns",
            metavar="EXPRESSION",
            help="run only the tests whose names match (pytest's -k: a substring, or an expression "
            "with and/or/not); may be repeated",
        )
        parser.add_argument(
            "--database",
            choices=("sqlite", "postgres"),
            default="sqlite",
            help="run on SQLite (as `make run`) or on a private PostgreSQL the suite starts (as production)",
        )
        parser.add_argument(
            "--keepdb",
            action=NotSupported,
            nargs=0,
            help="the test database is SQLite in memory, or lives in a private PostgreSQL that the "
            "run starts and removes, so there is none to keep",
        )
        parser.add_argument(
            "--parallel",
            action=NotSupported,
            nargs="?",
            help="the suite runs in one process (its end-to-end tests start real processes on free "
            "ports, and the machine's cores are theirs)",
        )

    def pytest_arguments(self, test_labels: list[str]) -> list[str]:
        arguments = [f"--database={self.database}"]
        arguments += {0: ["-q"], 2: ["-v"], 3: ["-vv"]}.get(self.verbosity, [])
        if self.failfast:
            arguments.append("--exitfirst")
        selection = [f"({' or '.join(self.tags)})"] if self.tags else []
        selection += [f"not {tag}" for tag in self.exclude_tags]
        if selection:
            arguments += ["-m", " and ".join(selection)]
        if self.test_name_patterns:
            arguments += ["-k", " or ".join(f"({pattern})" for pattern in self.test_name_patterns)]
        base_dir = Path(settings.BASE_DIR)
        # After `--`, arguments go to pytest as they are: `manage.py test -- --lf`.
        return arguments + [
            label if label.startswith("-") else pytest_target(label, base_dir) for label in test_labels
        ]

    def run_tests(self, test_labels: list[str], **_kwargs: object) -> int:
        # The suite's configuration whatever the labels name, as Django's settings are.
        configuration = str(Path(settings.BASE_DIR) / "pyproject.toml")
        command = [sys.executable, "-m", "pytest", "-c", configuration, *self.pytest_arguments(test_labels)]
        with subprocess.Popen(command, cwd=settings.BASE_DIR) as pytest_run:
            # Told to stop, pytest stops what it started first (tests/redis_plugin.py).
            signal.signal(signal.SIGTERM, lambda signum, frame: pytest_run.send_signal(signum))
            try:
                return pytest_run.wait()
            except KeyboardInterrupt:
                # Ctrl-C reached pytest too: it stops what it started (servers, stacks) first.
                return pytest_run.wait()
