"""Local attempts count up like SLURM's restarts: a run stopped, killed, crashed and resumed on 2 local ranks records
attempts 0, 2 and 3 in events.jsonl (the killed attempt recorded nothing and its number is not reused), and
launcher.status shows every end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.errors import EXIT_STOPPED
from launcher.observe.events import read_events
from tests.conftest import hq, launch, launcher_env

pytestmark = pytest.mark.dist


def test_local_attempts_count_up_and_a_silent_death_keeps_its_number(run_root: Path) -> None:
    common = ["trainer.max_steps=12", "trainer.log_every=1", "trainer.ckpt_every=4", "checkpoint.async_save=false",
              "local.nproc=2", "logger.backend=none", f"run.root={hq(run_root)}", "run.name=attempts"]
    run_dir = run_root / "attempts"
    stopped = launch(*common, SLURMTRAIN_TEST_SIGNAL="3:1")  # attempt 0: USR1 at step 3, checkpoint and stop
    assert stopped.returncode == EXIT_STOPPED, stopped.stderr[-3000:]
    killed = launch(*common, SLURMTRAIN_TEST_KILL_BEFORE_MARKER="8")  # attempt 1: rank 0 dies, records nothing
    assert killed.returncode != 0 and "SIGKILL" in killed.stderr, killed.stderr[-3000:]
    assert [e["kind"] for e in read_events(run_dir)] == ["stopped"]
    crashed = launch(*common, SLURMTRAIN_TEST_RAISE="1:6")  # attempt 2: rank 1 raises at step 6
    assert crashed.returncode not in (0, EXIT_STOPPED), crashed.stderr[-3000:]
    finished = launch(*common)  # attempt 3
    assert finished.returncode == 0, finished.stderr[-3000:]

    events = read_events(run_dir)
    assert [(e["kind"], e["attempt"]) for e in events] == [("stopped", 0), ("crashed", 2), ("finished", 3)], events
    assert all(e["job"] is None for e in events)
    status = subprocess.run([sys.executable, "-m", "launcher.status", str(run_dir), "--json"], capture_output=True,
                            text=True, env=launcher_env(), timeout=120)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["rows"][0]["events"] == {"stopped": 1, "crashed": 1, "finished": 1}
