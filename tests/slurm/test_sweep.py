"""Sweeps on the real local cluster: one job array, non-blocking, per-task preemption, sweep resume, bad points,
launcher.wait, status with accounting recomputed from sacct -D, and the report's loss curves."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from launcher.observe import figures
from launcher.sweeps.sweepdir import Sweep, load_sweep
from tests.conftest import ROOT, hq, launch, launcher_env, read_metrics
from tests.slurm.helpers import logged_steps, poll, release_requeued, squeue_state, wait_terminal

pytestmark = pytest.mark.slurm

SWEPT = ["optim.lr=1e-3,3e-3", "trainer.seed=1,2"]


def sweep_dir_of(stdout: str) -> Path:
    match = re.search(r"^sweep directory: (.+)$", stdout, re.MULTILINE)
    assert match, stdout
    return Path(match.group(1))


def sacct(job_id: str, fields: str, *flags: str) -> list[list[str]]:
    out = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", *flags, "-o", fields], capture_output=True,
                         text=True, check=True).stdout
    return [line.split("|") for line in out.splitlines() if line.strip()]


def history(job_id: str) -> list[str]:
    return [row[0].split()[0] for row in sacct(job_id, "State", "-D")]


def newest_checkpoint(run_dir: Path) -> int:
    steps = [int(p.parent.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*/COMPLETE")]
    return max(steps, default=0)


def snapshot(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def status_json(target: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "launcher.status", str(target), "--json"], capture_output=True,
                         text=True, env=launcher_env(), cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


# ---- acceptance 1, 5 (plain), 6: a 2x2 sweep of 50 steps is one array, the command does not wait
@dataclass
class Submitted:
    sweep: Sweep
    sweep_dir: Path
    stdout: str
    states_at_return: list[str]


@pytest.fixture(scope="module")
def short_sweep(tmp_path_factory: pytest.TempPathFactory) -> Submitted:
    root = tmp_path_factory.mktemp("sweep") / "runs with space's"
    root.mkdir()
    # The user's project directory holds its own train.py: the array tasks must still run our training package.
    (root / "train.py").write_text('raise SystemExit("the user\'s train.py was imported")\n')
    out = launch("-m", *SWEPT, "+cluster=local_slurm", "cluster.nodes=1", "trainer.max_steps=50",
                 "trainer.log_every=5", "logger.backend=none", f"run.root={hq(root)}", cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    sweep_dir = sweep_dir_of(out.stdout)
    sweep = load_sweep(sweep_dir)
    # Returned while the tasks are still queued or running: nothing waited for them.
    states = [squeue_state(p.jobs[-1]) for p in sweep.points]
    for p in sweep.points:
        wait_terminal(p.jobs[-1], timeout=300)
    return Submitted(sweep, sweep_dir, out.stdout, states)


def test_short_sweep_is_one_array_of_four_tasks_that_all_complete(short_sweep: Submitted) -> None:
    sweep, sweep_dir = short_sweep.sweep, short_sweep.sweep_dir
    assert len(sweep.arrays) == 1 and len(sweep.points) == 4
    array_id = sweep.arrays[0].array_id
    assert f"submitted array {array_id}: 4 tasks" in short_sweep.stdout
    assert [p.jobs for p in sweep.points] == [[f"{array_id}_{i}"] for i in range(4)]
    rows = sacct(array_id, "JobID,State")
    assert sorted(r[0] for r in rows) == [f"{array_id}_{i}" for i in range(4)]
    assert {r[1] for r in rows} == {"COMPLETED"}
    assert sorted(sweep.swept) == ["optim.lr", "trainer.seed"]
    for p in sweep.points:
        run_dir = Path(p.run_dir)
        assert run_dir.parent == sweep_dir.parent.parent  # the run directory it would have as a single run
        assert [r["step"] for r in read_metrics(run_dir)] == [1, *range(5, 51, 5)]
        assert (run_dir / "jobs.txt").read_text().split() == p.jobs
        assert "optim.lr" in (run_dir / "command.txt").read_text()


def test_short_sweep_command_returned_before_the_tasks_ended(short_sweep: Submitted) -> None:
    states = short_sweep.states_at_return
    assert all(s in ("PENDING", "RUNNING", "CONFIGURING") for s in states), states


def test_rerunning_a_finished_sweep_submits_nothing_and_changes_nothing(short_sweep: Submitted) -> None:
    sweep, sweep_dir = short_sweep.sweep, short_sweep.sweep_dir
    before = {p.run_dir: snapshot(Path(p.run_dir)) for p in sweep.points}
    again = launch("-m", *SWEPT, "+cluster=local_slurm", "cluster.nodes=1", "trainer.max_steps=50",
                   "trainer.log_every=5", "logger.backend=none", f"run.root={hq(sweep_dir.parent.parent)}")
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("finished at step 50: skipped") == 4
    assert "nothing submitted" in again.stdout
    assert {p.run_dir: snapshot(Path(p.run_dir)) for p in sweep.points} == before
    assert len(load_sweep(sweep_dir).arrays) == 1


# ---- acceptance 4: one invalid point, nothing queued
def test_sweep_with_an_invalid_point_exits_2_naming_it_and_queues_nothing(run_root: Path) -> None:
    out = launch("-m", "trainer.global_batch_size=16,20", "+cluster=local_slurm", "trainer.max_steps=5",
                 "run.root=" + hq(run_root), "launcher.sweep_name=badpoint")
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "sweep point 1 (trainer.global_batch_size=20)" in lines[0], out.stderr
    assert "multiple of 16" in lines[0]
    assert subprocess.run(["squeue", "-h", "-n", "badpoint"], capture_output=True, text=True).stdout == ""
    assert list(run_root.iterdir()) == []


# ---- launcher.wait=true: follows every task, non-zero when one did not complete
def test_wait_follows_the_array_and_fails_when_a_task_fails(run_root: Path) -> None:
    # Point 1 ("bad") crashes at run time (an injected failure in its step 2), after validation.
    # fsdp on a one-task allocation, too (torch's device mesh reads RANK, which SLURM does not set).
    # No retries of the failing point (cluster.max_failures=0): it fails for good at once.
    out = launch("-m", "run.name=good,bad", "+cluster=local_slurm", "cluster.nodes=1", "cluster.max_failures=0",
                 "strategy=fsdp", "trainer.max_steps=3", "logger.backend=none", f"run.root={hq(run_root)}",
                 "launcher.wait=true", timeout=400, SLURMTRAIN_TEST_RAISE="0:2", SLURMTRAIN_TEST_ONLY_IN="bad")
    assert out.returncode == 1, out.stderr[-3000:]
    sweep = load_sweep(sweep_dir_of(out.stdout))
    ok, bad = (p.jobs[-1] for p in sweep.points)
    assert f"job {ok}: COMPLETED" in out.stderr and f"job {bad}: FAILED" in out.stderr
    assert f"1 of 2 jobs completed; not completed: {bad} (FAILED)" in out.stderr
    assert sacct(ok, "State")[0][0] == "COMPLETED"


# ---- acceptance 2, 3, 5: one task preempted alone, two cancelled and resumed by re-running the sweep
STEPS = 150
FAULT_ARGS = ["+cluster=local_slurm", "cluster.nodes=1", f"trainer.max_steps={STEPS}", "trainer.log_every=1",
              "trainer.ckpt_every=20", "logger.backend=none"]


def test_preempt_one_task_cancel_two_and_resume_the_sweep(run_root: Path) -> None:
    args = ["-m", *SWEPT, *FAULT_ARGS, f"run.root={hq(run_root)}"]
    out = launch(*args)
    assert out.returncode == 0, out.stderr[-3000:]
    sweep_dir = sweep_dir_of(out.stdout)
    sweep = load_sweep(sweep_dir)
    array_id = sweep.arrays[0].array_id
    runs = [Path(p.run_dir) for p in sweep.points]
    tasks = [p.jobs[-1] for p in sweep.points]

    # Task 1 alone gets the preemption signal mid-run: it checkpoints, requeues itself (not the array) and resumes.
    poll(lambda: logged_steps(runs[1]) >= 5, 180, "task 1 to train")
    subprocess.run(["scancel", "--signal=USR1", "--full", tasks[1]], check=True)
    # Tasks 2 and 3 are cancelled (SIGTERM: they checkpoint and stop) once they have a complete checkpoint.
    for i in (2, 3):
        poll(lambda i=i: newest_checkpoint(runs[i]) >= 20, 240, f"task {i}'s first checkpoint")
        subprocess.run(["scancel", tasks[i]], check=True)
    release_requeued(tasks[1], timeout=180)
    for i in (0, 1):
        assert wait_terminal(tasks[i], timeout=400) == "COMPLETED"
    for i in (2, 3):
        assert wait_terminal(tasks[i], timeout=200) == "CANCELLED"
    assert "REQUEUED" in history(tasks[1]) and history(tasks[1])[-1] == "COMPLETED"
    for i in (0, 2, 3):
        assert "REQUEUED" not in history(tasks[i]), (i, history(tasks[i]))
    stopped_at = {i: newest_checkpoint(runs[i]) for i in (2, 3)}
    assert all(0 < s < STEPS for s in stopped_at.values()), stopped_at

    # Re-running the same sweep command resubmits exactly the two cancelled points, which resume.
    finished = {i: snapshot(runs[i]) for i in (0, 1)}
    again = launch(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = load_sweep(sweep_dir)
    assert len(resumed.arrays) == 2 and resumed.arrays[1].points == [2, 3]
    new_array = resumed.arrays[1].array_id
    assert new_array != array_id and f"submitted array {new_array}: 2 tasks" in again.stdout
    assert again.stdout.count(f"finished at step {STEPS}: skipped") == 2
    for i in (2, 3):
        assert f"resumes from step {stopped_at[i]}" in again.stdout
        assert resumed.points[i].jobs[0] == tasks[i] and resumed.points[i].jobs[-1].startswith(new_array + "_")
        assert wait_terminal(resumed.points[i].jobs[-1], timeout=400) == "COMPLETED"
        log = (sweep_dir / "slurm" / f"{resumed.points[i].jobs[-1]}_0_log.err").read_text()
        assert f"step_{stopped_at[i]}: step {stopped_at[i]}" in log, log[-2000:]
    assert {i: snapshot(runs[i]) for i in (0, 1)} == finished
    for run in runs:  # every step logged exactly once, across the requeue and the resubmission
        assert [r["step"] for r in read_metrics(run)] == list(range(1, STEPS + 1))

    # The preempted task's losses equal an uninterrupted run's of the same point.
    reference = launch("optim.lr=1e-3", "trainer.seed=2", *FAULT_ARGS[2:], "local.nproc=1",
                       f"run.root={hq(run_root / 'ref')}", "run.name=ref")
    assert reference.returncode == 0, reference.stderr[-2000:]
    assert [r["loss"] for r in read_metrics(runs[1])] == [r["loss"] for r in read_metrics(run_root / "ref" / "ref")]

    # Status: 4 rows and a total; CPU-hours (no GPUs here) recomputed from sacct -D over every attempt.
    status = status_json(sweep_dir)
    assert len(status["rows"]) == 4
    expected = 0.0
    for p in resumed.points:
        for job in p.jobs:
            expected += sum(int(e) * int(c) for e, c in sacct(job, "ElapsedRaw,AllocCPUS", "-D")) / 3600
    assert status["total"]["cpu_hours"] == pytest.approx(expected, rel=1e-6, abs=1e-9)
    assert expected > 0
    requeues = {row["job"]: row["requeues"] for row in status["rows"]}
    assert requeues[tasks[1]] == 1 and sum(requeues.values()) == 1


# ---- acceptance 5 (rows), 6: status and report on the finished short sweep
def test_status_shows_four_rows_and_a_total(short_sweep: Submitted) -> None:
    status = status_json(short_sweep.sweep_dir)
    rows = {row["job"]: row for row in status["rows"]}
    assert sorted(rows) == sorted(p.jobs[-1] for p in short_sweep.sweep.points)
    for p in short_sweep.sweep.points:
        row = rows[p.jobs[-1]]
        assert (row["state"], row["step"], row["max_steps"], row["checkpoint_step"]) == ("COMPLETED", 50, 50, 50)
        assert row["loss"] == read_metrics(Path(p.run_dir))[-1]["loss"]
        assert row["hours_unit"] == "CPU-h" and row["cpu_hours"] > 0
    assert status["total"]["runs"] == 4 and status["total"]["requeues"] == 0
    table = subprocess.run([sys.executable, "-m", "launcher.status", str(short_sweep.sweep_dir)], capture_output=True,
                           text=True, env=launcher_env(), timeout=120)
    assert table.returncode == 0 and "total (4 runs)" in table.stdout


def test_report_draws_four_loss_curves(short_sweep: Submitted) -> None:
    from launcher import report

    out = subprocess.run([sys.executable, "-m", "launcher.report", str(short_sweep.sweep_dir)], capture_output=True,
                         text=True, env=launcher_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    written = out.stdout.splitlines()
    assert str(short_sweep.sweep_dir / "loss.png") in written
    # The PNG written holds four curves: the first four colours of matplotlib's cycle, and not the fifth.
    import matplotlib.image
    from matplotlib import colors

    pixels = (matplotlib.image.imread(short_sweep.sweep_dir / "loss.png")[..., :3] * 255).round()
    drawn = {c: int((abs(pixels - [v * 255 for v in colors.to_rgb(c)]).max(-1) <= 2).sum()) for c in
             ("C0", "C1", "C2", "C3", "C4")}
    assert all(drawn[c] > 100 for c in ("C0", "C1", "C2", "C3")) and drawn["C4"] == 0, drawn
    # The figure the report draws: one line per point, its y-data the point's logged losses, labelled by the
    # swept values.
    target, title = report.load(short_sweep.sweep_dir)
    series = figures.metric_series(target.runs, "loss")
    fig = figures.line_figure(series, "loss", title)
    lines = fig.axes[0].get_lines()
    assert len(lines) == 4
    for line, p in zip(lines, short_sweep.sweep.points, strict=True):
        assert list(line.get_ydata()) == [r["loss"] for r in read_metrics(Path(p.run_dir))]
        assert line.get_label() == short_sweep.sweep.point_label(p)
