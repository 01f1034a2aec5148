"""`python manage.py test`, as a Django engineer runs it: the suite's tests through pytest."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from tests.runner import pytest_target

BASE_DIR = Path(settings.BASE_DIR)
# pytest's last line: "==== 3 passed, 1 deselected in 0.52s ====", its counts without the time.
CLOSING_COUNTS = re.compile(r"=+ (.+) in [\d.]+s(?: \([\d:]+\))? =+")

A_FAILING_AND_A_PASSING_TEST = """
def test_fails():
    assert "answer" == "other answer"


def test_passes():
    pass
"""

A_MARKED_AND_AN_UNMARKED_TEST = """
import pytest


@pytest.mark.{marker}
def test_marked():
    pass


def test_unmarked():
    pass
"""


def closing_counts(output: str) -> str:
    match = CLOSING_COUNTS.fullmatch(output.strip().splitlines()[-1])
    assert match is not None, output
    return match.group(1)


def run(*command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *command], cwd=BASE_DIR, capture_output=True, text=True, env=env, timeout=300
    )


def manage_py_test(*arguments: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run("manage.py", "test", *arguments, env=env)


def test_manage_py_test_runs_a_dotted_label_as_pytest_runs_its_module():
    django = manage_py_test("tests.config.test_beat")
    pytest_run = run("-m", "pytest", "tests/config/test_beat.py")

    assert django.returncode == 0, django.stdout + django.stderr
    assert closing_counts(django.stdout) == closing_counts(pytest_run.stdout)
    assert "passed" in closing_counts(django.stdout)


def test_a_failing_test_makes_manage_py_test_exit_non_zero_and_failfast_stops_there(tmp_path: Path):
    module = tmp_path / "test_outcomes.py"
    module.write_text(A_FAILING_AND_A_PASSING_TEST)

    result = manage_py_test(str(module), "--failfast")

    assert result.returncode != 0
    assert closing_counts(result.stdout) == "1 failed"


@pytest.mark.parametrize(
    ("option", "ran", "left_out"),
    [("--exclude-tag", "test_unmarked", "test_marked"), ("--tag", "test_marked", "test_unmarked")],
)
def test_tags_choose_tests_by_their_pytest_marker(tmp_path: Path, option: str, ran: str, left_out: str):
    module = tmp_path / "test_marked.py"
    module.write_text(A_MARKED_AND_AN_UNMARKED_TEST.format(marker="e2e"))

    result = manage_py_test(str(module), option, "e2e", "-v", "2")

    assert result.returncode == 0, result.stdout + result.stderr
    assert closing_counts(result.stdout) == "1 passed, 1 deselected"
    assert f"{ran} PASSED" in result.stdout
    assert left_out not in result.stdout


def test_vllm_tests_without_the_prepared_model_stop_the_run_with_one_message(tmp_path: Path):
    module = tmp_path / "test_on_vllm.py"
    module.write_text(A_MARKED_AND_AN_UNMARKED_TEST.format(marker="vllm"))
    empty_model = tmp_path / "model"
    empty_model.mkdir()

    result = manage_py_test(str(module), env={**os.environ, "INFERENCE_MODEL": str(empty_model)})

    assert result.returncode != 0
    complaints = [line for line in (result.stdout + result.stderr).splitlines() if "cannot run" in line]
    assert len(complaints) == 1
    assert complaints[0].startswith("ERROR: the 1 vllm tests cannot run")
    assert "--exclude-tag vllm" in complaints[0]
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("label", "node_id"),
    [
        ("tests.knowledge", "tests/knowledge"),
        ("knowledge", "tests/knowledge"),
        ("tests.scheduler.test_rate_limits", "tests/scheduler/test_rate_limits.py"),
        ("tests.scheduler.test_rate_limits.test_name", "tests/scheduler/test_rate_limits.py::test_name"),
        ("tests.api.test_api.TestCase.test_name", "tests/api/test_api.py::TestCase::test_name"),
        ("tests/knowledge/test_cache.py::test_name", "tests/knowledge/test_cache.py::test_name"),
    ],
)
def test_django_labels_name_the_same_tests_for_pytest(label: str, node_id: str):
    assert pytest_target(label, BASE_DIR) == node_id
