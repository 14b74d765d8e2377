"""`-m` without +cluster: the points train here one after another, a summary table ends the sweep, the same
sweep command skips finished points, a failed point makes the sweep fail without stopping the others, and a second
Ctrl-C stops the sweep."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from contract.errors import EXIT_KILLED
from contract.rundir.events import read_events
from launcher.sweeps.sweepdir import load_sweep
from tests.conftest import hq, launch, launcher_env, read_metrics

pytestmark = pytest.mark.dist


def _files(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_local_sweep_runs_each_point_and_resumes_as_a_whole(run_root: Path) -> None:
    # From a project directory with its own train.py: our workers must still run our training package.
    (run_root / "train.py").write_text('raise SystemExit("the user\'s train.py was imported")\n')
    args = ["-m", "optim.lr=1e-3,3e-3", "trainer.max_steps=6", "trainer.log_every=3", "local.nproc=2",
            "logger.backend=none", f"run.root={hq(run_root)}", "launcher.sweep_name=local lr"]
    out = launch(*args, cwd=run_root)
    assert out.returncode == 0, out.stderr[-3000:]
    sweep = load_sweep(run_root / "sweeps" / "local lr")
    assert [p.overrides[0] for p in sweep.points] == ["optim.lr=0.001", "optim.lr=0.003"] and sweep.swept == ["optim.lr"]
    finals = []
    for p in sweep.points:
        rows = read_metrics(Path(p.run_dir))
        assert [r["step"] for r in rows] == [1, 3, 6]
        finals.append(rows[-1]["loss"])
        assert f"{rows[-1]['loss']:.4f}" in out.stderr  # the summary table's final loss column
        # Its own wandb run (its own run directory and id), grouped by the sweep's name.
        assert OmegaConf.load(Path(p.run_dir) / "config.yaml").logger.group == "local lr"
    assert finals[0] != finals[1]
    assert out.stderr.count("finished") >= 2 and "sweep local lr" in out.stderr

    before = {p.run_dir: _files(Path(p.run_dir)) for p in sweep.points}
    again = launch(*args, cwd=run_root)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("finished at step 6: skipped") == 2
    assert "launcher: started" not in again.stderr  # no worker started
    assert {p.run_dir: _files(Path(p.run_dir)) for p in sweep.points} == before


def test_a_failed_point_fails_the_sweep_after_the_others_ran(run_root: Path) -> None:
    # Point 0 ("bad") raises in its step 2 (an injected crash); point 1 trains.
    out = launch("-m", "run.name=bad,good", "trainer.max_steps=2", "local.nproc=1", "logger.backend=none",
                 f"run.root={hq(run_root)}", cwd=run_root, SLURMTRAIN_TEST_RAISE="0:2", SLURMTRAIN_TEST_ONLY_IN="bad")
    assert out.returncode == 1, out.stderr[-3000:]
    assert "failed (exit" in out.stderr
    sweep = load_sweep(next((run_root / "sweeps").iterdir()))
    assert [r["step"] for r in read_metrics(Path(sweep.points[1].run_dir))] == [1, 2]


def test_a_second_ctrl_c_stops_the_sweep_not_only_its_point(run_root: Path) -> None:
    # Point 0 stops making progress in its step 3; a second Ctrl-C stops it at once: the next point must not start.
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "-m", "run.name=first,second", "trainer.max_steps=4",
                             "trainer.log_every=1", "local.nproc=1", "logger.backend=none", f"run.root={hq(run_root)}"],
                            cwd=run_root, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=launcher_env(SLURMTRAIN_TEST_HANG="0:3", SLURMTRAIN_TEST_ONLY_IN="first",
                                             SLURMTRAIN_TEST_INTERRUPT_WINDOW_S="0"))
    assert proc.stderr is not None
    seen = []
    for wanted in ("stops making progress in step 3", "got SIGINT"):
        if wanted == "got SIGINT":
            proc.send_signal(signal.SIGINT)
        for line in proc.stderr:
            seen.append(line.decode(errors="replace"))
            if wanted in seen[-1]:
                break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    full = "".join(seen) + err.decode()
    said = full[-3000:]
    assert proc.returncode == EXIT_KILLED, said
    assert "killed (resumable from its last checkpoint)" in said
    sweep = load_sweep(next((run_root / "sweeps").iterdir()))
    assert [e["kind"] for e in read_events(Path(sweep.points[0].run_dir))] == ["killed"]
    assert full.count("launcher: started") == 1  # the second point never started
    assert not (Path(sweep.points[1].run_dir) / "local_attempts.txt").exists()
