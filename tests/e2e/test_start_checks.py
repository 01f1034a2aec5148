"""Every process refuses to start on settings that cannot work, and says what to change."""

import subprocess
import sys

import pytest

from launcher.process import ROOT, free_port
from launcher.stack import inherited_env as child_env

pytestmark = pytest.mark.e2e

COMMANDS = {
    "web": [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", "{port}", "config.asgi:application"],
    "inference": [sys.executable, "manage.py", "runworker", "inference"],
    "celery": [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool", "threads", "--beat"],
    "celery beat": [sys.executable, "-m", "celery", "-A", "config", "beat", "--schedule", "{schedule}"],
}


@pytest.mark.parametrize("process", COMMANDS)
def test_one_slot_with_the_default_vip_reserve_stops_the_process_at_start(process, tmp_path):
    values = {"{port}": str(free_port()), "{schedule}": str(tmp_path / "celerybeat-schedule")}
    command = [values.get(part, part) for part in COMMANDS[process]]
    env = child_env(
        INFERENCE_MAX_NUM_SEQS="1",  # VIP_RESERVED_SLOTS keeps its default of 2
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",  # nothing there: it must not get that far
    )
    finished = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert finished.returncode != 0
    assert "(inference.E002) VIP_RESERVED_SLOTS = 2 of INFERENCE_MAX_NUM_SEQS = 1 slots" in finished.stderr
    assert "HINT: Set VIP_RESERVED_SLOTS below INFERENCE_MAX_NUM_SEQS" in finished.stderr
