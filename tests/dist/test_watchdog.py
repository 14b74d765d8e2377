"""The hang watchdog on 2 local ranks: a rank that stops making progress makes every rank dump its stacks and
exit within the timeout plus a margin; rank 0 says where each rank was; the attempt's end is in events.jsonl; the
same command resumes and the status shows the ends and the goodput."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from contract.rundir.events import read_events
from tests.conftest import hq, launch, launcher_env
from contract.rundir.ckpt_layout import latest_complete_checkpoint
from train.faults.watchdog import EXIT_HUNG

pytestmark = pytest.mark.dist

TIMEOUT_S = 3.0
# The watchdog looks every 0.25 s; the margin also covers a loaded machine.
MARGIN_S = 1.5


def test_a_hung_rank_ends_every_rank_with_stack_dumps_and_the_run_resumes(run_root: Path) -> None:
    common = ["trainer.max_steps=12", "trainer.log_every=1", "trainer.ckpt_every=4", "local.nproc=2",
              "logger.backend=none", f"run.root={hq(run_root)}", "run.name=hang",
              f"watchdog.step_timeout_s={TIMEOUT_S}"]
    hung = launch(*common, SLURMTRAIN_TEST_HANG="1:6")
    assert hung.returncode == EXIT_HUNG, hung.stderr[-3000:]
    run_dir = run_root / "hang"
    for rank in (0, 1):
        text = (run_dir / "hangs" / f"rank{rank}.txt").read_text()
        header = json.loads(text.splitlines()[0])
        assert header["section"] == "step" and header["last_finished_step"] == 5
        assert TIMEOUT_S <= header["fired_at"] - header["entered_at"] <= TIMEOUT_S + MARGIN_S, header
        assert "Thread 0x" in text or "Current thread 0x" in text  # every thread's Python stack
    # Rank 0 names where each rank was: rank 1 in the injected hang, rank 0 waiting for it.
    log = (run_dir / "logs" / "rank_0.log").read_text()
    assert "hang: rank 1 on" in log and "last finished step 5" in log and "in step_started" in log
    # Rank 0 loaded its batch and waits in backward's collective; rank 1 never started: it is named.
    assert "hang: rank(s) 1 made the least progress" in log
    [event] = read_events(run_dir)
    assert event["host"] == json.loads((run_dir / "hangs" / "rank1.txt").read_text().splitlines()[0])["host"]
    latest = latest_complete_checkpoint(run_dir)  # step 4's asynchronous save, if it completed before the hang
    kept = latest.step if latest else 0
    assert event["kind"] == "hung" and event["step"] == 5 and event["steps_lost"] == 5 - kept

    resumed = launch(*common)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not kept or f"resumed from {run_dir / 'checkpoints' / 'step_4'}" in resumed.stderr
    assert [e["kind"] for e in read_events(run_dir)] == ["hung", "finished"]
    learned = json.loads((run_dir / "watchdog.json").read_text())
    assert learned["observations"]["step"] >= 3 and 0 < learned["longest_s"]["step"] < TIMEOUT_S

    status = subprocess.run([sys.executable, "-m", "launcher.status", str(run_dir), "--json"], capture_output=True,
                            text=True, env=launcher_env(), timeout=120)
    assert status.returncode == 0, status.stderr
    row = json.loads(status.stdout)["rows"][0]
    assert row["events"] == {"hung": 1, "finished": 1}
    assert 0 < row["goodput"] < 1
