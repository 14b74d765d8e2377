"""A search on the real local cluster (acceptance 3): its workers are one job array; `scancel` of the whole array
mid-trial, then the same command, continues the study to search.n_trials with no trial lost or run twice; a second
search in another directory runs beside it and the two never mix."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from contract.rundir import ckpt_layout
from contract.search import layout
from contract.search.optuna_objects import load_study
from tests.conftest import hq, launch
from tests.slurm.helpers import poll

pytestmark = pytest.mark.slurm

COMMON = ["-m", "hydra/sweeper=search", "+cluster=local_slurm", "cluster.nodes=1", "logger.backend=none",
          "telemetry.enabled=false", "search.pruner=asha"]
# Long enough trials (about 10 s of steps) that the cancel lands in one; a checkpoint every evaluation.
TRIAL = ["trainer.max_steps=100", "eval.every=10", "trainer.ckpt_every=10"]


def trials(sweep_dir: Path) -> list:  # type: ignore[type-arg]
    return load_study(sweep_dir, layout.load_spec(sweep_dir)).get_trials(deepcopy=False)


def reported(sweep_dir: Path) -> Counter[tuple[int, int]]:
    ops = [json.loads(line) for line in (sweep_dir / layout.JOURNAL_FILE).read_text().splitlines() if line.strip()]
    return Counter((op["trial_id"], op["step"]) for op in ops if "intermediate_value" in op)


def array_id(stdout: str) -> str:
    found = re.search(r"submitted (?:array|job) (\d+): ", stdout)
    assert found, stdout
    return found.group(1)


def test_scancel_then_the_same_command_continues_the_study(run_root: Path) -> None:
    args = [*COMMON, *TRIAL, "optim.lr=tag(log,interval(1e-3,3e-2))", "search.n_trials=4", "search.parallel=2",
            f"run.root={hq(run_root)}", "launcher.sweep_name=cancelled"]
    sweep_dir = run_root / "sweeps" / "cancelled"
    first = launch(*args, cwd=run_root)
    assert first.returncode == 0, first.stderr[-3000:]
    array = array_id(first.stdout)

    def trial_in_flight() -> bool:  # a RUNNING trial with a checkpoint short of its end
        for t in trials(sweep_dir) if (sweep_dir / layout.JOURNAL_FILE).exists() else []:
            latest = ckpt_layout.latest_complete_checkpoint(layout.trial_dir(sweep_dir, t.number))
            if t.state.name == "RUNNING" and latest is not None and latest.step < 100:
                return True
        return False

    poll(trial_in_flight, 300, "a trial to checkpoint mid-way", interval=0.2)
    subprocess.run(["scancel", array], check=True)
    poll(lambda: not subprocess.run(["squeue", "-h", "-j", array], capture_output=True, text=True).stdout.strip(),
         180, "the array to leave the queue")
    interrupted = [t.number for t in trials(sweep_dir) if t.state.name == "RUNNING"]
    # Those that had checkpointed resume from it (one asked just before the cancel starts afresh).
    checkpointed = [n for n in interrupted if ckpt_layout.latest_complete_checkpoint(layout.trial_dir(sweep_dir, n))]
    assert checkpointed, [(t.number, t.state) for t in trials(sweep_dir)]

    # A second search in another directory, submitted while the first goes on: its own study, its own trials.
    other_args = [*COMMON, *TRIAL, "optim.lr=tag(log,interval(1e-3,3e-2))", "search.n_trials=2", "search.parallel=1",
                  f"run.root={hq(run_root)}", "launcher.sweep_name=other", "launcher.wait=true"]
    other = subprocess.Popen(["python", "-m", "launcher", *other_args], cwd=run_root, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    again = launch(*args, "launcher.wait=true", cwd=run_root, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"trial(s) {', '.join(map(str, interrupted))} were left running" in again.stderr
    assert other.wait(timeout=900) == 0, other.stderr.read()[-3000:] if other.stderr else ""

    ts = trials(sweep_dir)
    assert sorted(t.number for t in ts) == [0, 1, 2, 3]
    assert {t.state.name for t in ts} <= {"COMPLETE", "PRUNED"}, [(t.number, t.state) for t in ts]
    assert max(reported(sweep_dir).values()) == 1
    for number in checkpointed:
        log = (layout.trial_dir(sweep_dir, number) / "logs" / "rank_0.log").read_text()
        assert "resumed from" in log, log[-2000:]
    others = trials(run_root / "sweeps" / "other")
    assert len(others) == 2 and {t.state.name for t in others} <= {"COMPLETE", "PRUNED"}
    for sweep, ts_ in ((sweep_dir, ts), (run_root / "sweeps" / "other", others)):
        for t in ts_:
            assert Path(t.user_attrs["run_dir"]).parent == sweep / layout.TRIALS_DIR
    assert sorted(p.name for p in (sweep_dir / layout.TRIALS_DIR).iterdir()) == [f"trial_{n:04d}" for n in range(4)]


def test_usr1_to_a_worker_requeues_it_and_it_resumes_its_trial(run_root: Path) -> None:
    """A preemption signal to the worker's batch shell (`scancel --signal=USR1 --batch`), which passes it to the worker:
    the trial checkpoints, the worker requeues its task, and the task, started again, resumes that same trial from
    its checkpoint (reporting no value twice)."""
    from tests.slurm.helpers import release_requeued, wait_terminal

    args = [*COMMON, *TRIAL, "optim.lr=tag(log,interval(1e-3,1e-2))", "search.n_trials=1", "search.parallel=1",
            f"run.root={hq(run_root)}", "launcher.sweep_name=preempted"]
    out = launch(*args, cwd=run_root)
    assert out.returncode == 0, out.stderr[-3000:]
    # One worker is a plain job, and said so: 'submitted array' named no array, and JOB_0 was no id (issue 48 item 10).
    assert re.search(r"submitted job \d+: 1 search worker\n", out.stdout), out.stdout
    job = array_id(out.stdout)
    run_dir = layout.trial_dir(run_root / "sweeps" / "preempted", 0)
    poll(lambda: (c := ckpt_layout.latest_complete_checkpoint(run_dir)) is not None and c.step >= 10, 300,
         "the trial's first checkpoint", interval=0.2)
    # --batch: the batch shell alone gets it; it said the ranks checkpoint and requeue, and nothing did (item 7).
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True)
    release_requeued(job)
    assert wait_terminal(job, timeout=300) == "COMPLETED"
    sweep_dir = run_root / "sweeps" / "preempted"
    [trial] = trials(sweep_dir)
    assert trial.state.name == "COMPLETE" and trial.user_attrs["steps"] == 100
    assert "resumed from" in (run_dir / "logs" / "rank_0.log").read_text()
    assert max(reported(sweep_dir).values()) == 1
    assert sorted(trial.intermediate_values) == list(range(0, 101, 10))
