"""contract.rundir.accounting parsing against fake sacct/squeue executables, and launcher.status rows, totals and CLI."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from contract.rundir import accounting, metrics_file
from launcher import status
from launcher.checks.resume_checks import REQUIRED
from launcher.sweeps.sweepdir import Point, Sweep, save_sweep
from tests.conftest import ROOT

GPU_CLUSTER = {"name": "h100x8", "nodes": 2, "gpus_per_node": 8, "tasks_per_node": None, "cpus_per_task": 12,
               "price_per_gpu_hour": 2.5}
CPU_CLUSTER = {"name": "local_slurm", "nodes": 2, "gpus_per_node": 0, "tasks_per_node": 1, "cpus_per_task": 1,
               "price_per_gpu_hour": None}

FAKE_SLURM = """#!{python}
import json, sys
table = json.load(open({table!r}))
me = {name!r}
with open({log!r}, "a") as log:
    log.write(json.dumps([me] + sys.argv[1:]) + "\\n")
answer = table.get(me)
if answer is None:
    sys.exit(0)
if "exit" in answer:
    sys.stderr.write(answer.get("stderr", ""))
    sys.exit(answer["exit"])
ids = sys.argv[sys.argv.index("-j") + 1].split(",")
for job_id in ids:
    for line in answer.get(job_id, []):
        print(line)
"""


class FakeSlurm:
    """`sacct` and `squeue` first on PATH, answering canned lines per job id; each call is logged."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir, self.table_path, self.log_path = bin_dir, bin_dir / "table.json", bin_dir / "calls.jsonl"
        self.table: dict[str, Any] = {}
        bin_dir.mkdir(exist_ok=True)
        for name in ("sacct", "squeue"):
            script = bin_dir / name
            script.write_text(FAKE_SLURM.format(python=sys.executable, table=str(self.table_path),
                                                log=str(self.log_path), name=name))
            script.chmod(0o755)
        self.save()

    def answer(self, tool: str, job_id: str, *lines: str) -> None:
        self.table.setdefault(tool, {})[job_id] = list(lines)
        self.save()

    def fail(self, tool: str, code: int, stderr: str) -> None:
        self.table[tool] = {"exit": code, "stderr": stderr}
        self.save()

    def remove(self, tool: str) -> None:
        (self.bin_dir / tool).unlink()

    def save(self) -> None:
        self.table_path.write_text(json.dumps(self.table))

    def calls(self) -> list[list[str]]:
        if not self.log_path.is_file():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines()]


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    fake = FakeSlurm(tmp_path / "bin")
    # Only the fakes: a real SLURM client on this machine must not answer instead.
    monkeypatch.setenv("PATH", str(fake.bin_dir))
    return fake


def sacct_line(job_id: str, state: str, elapsed_s: int, gpus: int, cpus: int) -> str:
    tres = f"billing={cpus},cpu={cpus},gres/gpu={gpus},mem=64G,node=1" if gpus else f"billing={cpus},cpu={cpus},node=1"
    return f"{job_id}|{state}|{elapsed_s}|{tres}|{cpus}"


def write_run(run_dir: Path, *, name: str, max_steps: int, cluster: dict[str, Any] | None = None,
              losses: list[float] | None = None, jobs: list[str] | None = None, checkpoints: dict[int, bool] | None = None,
              torn_tail: bool = False, lr: float = 1e-3) -> list[dict[str, Any]]:
    """A run directory as the training side leaves it; returns the metrics rows written (the learning rate falls
    linearly from `lr` to lr / 10, the gradient norm from 1)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    # Every section a saved config has (resume_checks.REQUIRED): without one, the config is damaged.
    config = {**{section: {} for section in REQUIRED}, "run": {"name": name}, "trainer": {"max_steps": max_steps},
              "cluster": cluster}
    (run_dir / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    n = len(losses or [])
    rows = [{"step": 10 * (i + 1), "loss": loss, "lr": lr * (1 - 0.9 * i / max(n - 1, 1)), "grad_norm": 1.0 / (i + 1),
             "tokens_per_s": 1000.0 + 37 * i, "tokens": 4096 * (i + 1)} for i, loss in enumerate(losses or [])]
    if rows or torn_tail:
        text = "".join(metrics_file.encode_row(r) + "\n" for r in rows)
        (run_dir / "metrics.jsonl").write_text(text + ('{"step": 99, "lo' if torn_tail else ""))
    if jobs is not None:
        (run_dir / "jobs.txt").write_text("".join(f"{j}\n" for j in jobs))
    for step, complete in (checkpoints or {}).items():
        ckpt = run_dir / "checkpoints" / f"step_{step}"
        ckpt.mkdir(parents=True)
        if complete:
            (ckpt / "COMPLETE").write_text("{}\n")
    return rows


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert status.main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# ---- accounting ----

def test_attempts_of_a_requeued_then_running_array_task(slurm: FakeSlurm) -> None:
    first = (3600, 8, 96)
    second = (1200, 8, 96)
    slurm.answer("sacct", "57_3", sacct_line("57_3", "REQUEUED", *first), sacct_line("57_3", "RUNNING", *second))
    slurm.answer("sacct", "58", sacct_line("58", "CANCELLED by 1000", 60, 0, 4))
    found = accounting.attempts(["57_3", "58"])
    assert found == {
        "57_3": [accounting.Attempt("57_3", "REQUEUED", *first), accounting.Attempt("57_3", "RUNNING", *second)],
        "58": [accounting.Attempt("58", "CANCELLED", 60, 0, 4)],
    }
    [call] = slurm.calls()
    assert call[0] == "sacct" and {"-D", "-X", "-P", "-n"} <= set(call)
    assert call[call.index("-j") + 1] == "57_3,58"


def test_unsplit_pending_array_stands_for_its_tasks(slurm: FakeSlurm) -> None:
    # Before a task is split off its array, sacct knows it only as the array's `60_[0-3%2]` record.
    slurm.answer("sacct", "60", "60_[0-3%2]|PENDING|0||1")
    found = accounting.attempts(["60_2", "60_7"])
    assert found is not None
    assert [a.state for a in found["60_2"]] == ["PENDING"]
    assert found["60_7"] == []


@pytest.mark.parametrize(("tres", "gpus"), [
    ("billing=96,cpu=96,gres/gpu=8,mem=1T,node=1", 8),
    ("cpu=8,gres/gpu:a100=2,gres/gpu:h100=4", 6),
    ("cpu=8,gres/gpu=4,gres/gpu:h100=4", 4),
    ("billing=1,cpu=1,node=1", 0),
    ("", 0),
])
def test_gpus_in_tres(tres: str, gpus: int) -> None:
    assert accounting.gpus_in_tres(tres) == gpus


def test_queue_state(slurm: FakeSlurm) -> None:
    slurm.answer("squeue", "57_3", "RUNNING")
    assert accounting.queue_state("57_3") == "RUNNING"
    assert accounting.queue_state("58") == ""
    assert slurm.calls()[0] == ["squeue", "-h", "-j", "57_3", "-o", "%T"]
    slurm.fail("squeue", 1, "slurm_load_jobs error: Invalid job id specified\n")
    assert accounting.queue_state("58") == ""
    slurm.fail("squeue", 1, "slurm_load_jobs error: Unable to contact slurm controller\n")
    assert accounting.queue_state("58") is None
    slurm.remove("squeue")
    assert accounting.queue_state("58") is None


def test_attempts_without_accounting(slurm: FakeSlurm) -> None:
    slurm.fail("sacct", 1, "sacct: error: Problem talking to the database: Connection refused\n")
    assert accounting.attempts(["42"]) is None
    slurm.remove("sacct")
    assert accounting.attempts(["42"]) is None


# ---- status rows ----

def make_sweep(root: Path, slurm: FakeSlurm) -> tuple[Path, dict[str, Any]]:
    """A 3-point GPU sweep: point 0 requeued once and now running, point 1 done, point 2 still pending."""
    sweep_dir = root / "sweeps" / "lr sweep"
    attempts = {"57_0": [("REQUEUED", 3600, 16, 192), ("RUNNING", 1800, 16, 192)],
                "57_1": [("COMPLETED", 5400, 16, 192)]}
    losses = {0: [4.0, 3.5], 1: [4.1, 3.2, 2.9], 2: []}
    points = []
    for i, lr in enumerate(["1e-4", "3e-4", "1e-3"]):
        run_dir = root / f"run {i}"
        write_run(run_dir, name=f"run {i}", max_steps=30, cluster=GPU_CLUSTER, losses=losses[i],
                  checkpoints={10: True, 20: i != 0})
        points.append(Point(i, [f"optim.lr={lr}", "model=tiny"], str(run_dir), [f"57_{i}"]))
    save_sweep(sweep_dir, Sweep("lr sweep", "python -m launcher -m optim.lr=...", ["optim.lr"], points))
    for job_id, rows in attempts.items():
        slurm.answer("sacct", job_id, *(sacct_line(job_id, *a) for a in rows))
    slurm.answer("sacct", "57", "57_[2]|PENDING|0||1")
    slurm.answer("squeue", "57_0", "RUNNING")
    slurm.answer("squeue", "57_2", "PENDING")
    return sweep_dir, {"attempts": attempts, "losses": losses}


def gpu_hours(rows: list[tuple[str, int, int, int]]) -> float:
    return sum(elapsed / 3600 * gpus for _, elapsed, gpus, _ in rows)


def test_sweep_rows_and_total(run_root: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]) -> None:
    sweep_dir, made = make_sweep(run_root, slurm)
    out = run_json(capsys, str(sweep_dir))
    rows = out["rows"]
    assert [r["name"] for r in rows] == ["optim.lr=1e-4", "optim.lr=3e-4", "optim.lr=1e-3"]
    assert [r["job"] for r in rows] == ["57_0", "57_1", "57_2"]
    assert [r["state"] for r in rows] == ["RUNNING", "COMPLETED", "PENDING"]
    assert [r["requeues"] for r in rows] == [1, 0, 0]
    assert [r["checkpoint_step"] for r in rows] == [10, 20, 20]
    # The newest logged step, never below the newest checkpoint (point 2 has logged nothing yet, and resumes at 20).
    assert [r["step"] for r in rows] == [max(10 * len(made["losses"][i]), r["checkpoint_step"]) for i, r in
                                         enumerate(rows)]
    assert [r["loss"] for r in rows] == [made["losses"][0][-1], made["losses"][1][-1], None]
    assert rows[0]["max_steps"] == 30 and isinstance(rows[0]["tokens_per_s"], float)
    expected = [gpu_hours(made["attempts"]["57_0"]), gpu_hours(made["attempts"]["57_1"]), 0.0]
    assert [r["gpu_hours"] for r in rows] == pytest.approx(expected)
    assert [r["cost"] for r in rows] == pytest.approx([h * GPU_CLUSTER["price_per_gpu_hour"] for h in expected])
    assert all(r["cpu_hours"] is None and r["hours_unit"] == "GPU-h" for r in rows)
    total = out["total"]
    assert total["gpu_hours"] == pytest.approx(sum(expected))
    assert total["cost"] == pytest.approx(sum(expected) * GPU_CLUSTER["price_per_gpu_hour"])
    assert total["states"] == {"RUNNING": 1, "COMPLETED": 1, "PENDING": 1}
    assert total["requeues"] == 1 and total["runs"] == 3


def test_cpu_cluster_counts_cpu_hours_and_every_job_of_a_run(run_root: Path, slurm: FakeSlurm,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # Resubmitted by hand after a failure: two job ids, the first requeued once.
    write_run(run_root / "r", name="cpu run", max_steps=20, cluster=CPU_CLUSTER, losses=[3.0], jobs=["41", "44"])
    slurm.answer("sacct", "41", sacct_line("41", "REQUEUED", 300, 0, 2), sacct_line("41", "FAILED", 120, 0, 2))
    slurm.answer("sacct", "44", sacct_line("44", "COMPLETED", 900, 0, 2))
    [row] = run_json(capsys, str(run_root / "r"))["rows"]
    assert row["state"] == "COMPLETED" and row["job"] == "44" and row["requeues"] == 1
    assert row["cpu_hours"] == pytest.approx((300 + 120 + 900) / 3600 * 2)
    assert row["gpu_hours"] is None and row["cost"] is None and row["hours_unit"] == "CPU-h"
    text = render(run_root / "r")
    assert "CPU-h" in text and "GPU-h" not in text


def render(path: Path) -> str:
    from rich.console import Console

    console = Console(file=io.StringIO(), width=200)
    console.print(status.snapshot(path, status.find_runs(path)))
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_local_run_states(run_root: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(run_root / "done", name="done", max_steps=20, losses=[3.0, 2.0], checkpoints={20: True})
    write_run(run_root / "cut", name="cut", max_steps=20, losses=[3.0], checkpoints={10: True, 20: False},
              torn_tail=True)
    write_run(run_root / "fresh", name="fresh", max_steps=20)
    out = run_json(capsys, str(run_root))
    by_name = {r["name"]: r for r in out["rows"]}
    assert {n: r["state"] for n, r in by_name.items()} == {"done": "finished", "cut": "stopped",
                                                           "fresh": "not started"}
    assert by_name["cut"]["step"] == 10 and by_name["cut"]["checkpoint_step"] == 10  # torn line, incomplete ckpt
    assert all(r["job"] == "local" and r["gpu_hours"] is None and r["cpu_hours"] is None for r in out["rows"])
    assert slurm.calls() == []


def test_a_local_run_stopped_cleanly_reads_stopped_once_its_processes_are_gone(
        run_root: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]) -> None:
    """A Ctrl-C's checkpointed stop (or ranks that checkpointed after their launcher was killed) is `stopped`; only an
    attempt that recorded no end and whose rank 0 is gone is `died`."""
    import socket

    from contract.rundir.events import record_event

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a rank 0 pid that no longer runs
    for name in ("stopped", "silent"):
        write_run(run_root / name, name=name, max_steps=20, losses=[3.0], checkpoints={10: True})
        (run_root / name / "local_attempts.txt").write_text(f"0 1.0 {socket.gethostname()} {gone.pid}\n")
    record_event(run_root / "stopped", "stopped", attempt=0, job=None, step=10)
    out = run_json(capsys, str(run_root))
    assert {r["name"]: r["state"] for r in out["rows"]} == {"stopped": "stopped", "silent": "died"}


@pytest.mark.parametrize(("value", "text"), [(float("nan"), "nan"), (float("inf"), "inf"), (float("-inf"), "-inf")])
def test_a_diverged_run_says_so_in_text_and_json(run_root: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str],
                                                 value: float, text: str) -> None:
    # Finished (a checkpoint at max_steps) with a loss that went non-finite at step 20 and stayed so.
    write_run(run_root / "dead", name="dead", max_steps=30, losses=[3.0, value, value], checkpoints={30: True})
    write_run(run_root / "fresh", name="fresh", max_steps=30)
    assert status.main([str(run_root), "--json"]) == 0
    printed = capsys.readouterr().out

    def refuse(token: str) -> Any:
        raise AssertionError(f"status --json printed {token}, which is not JSON")

    by_name = {r["name"]: r for r in json.loads(printed, parse_constant=refuse)["rows"]}
    dead, fresh = by_name["dead"], by_name["fresh"]
    assert dead["state"] == "finished" and dead["loss"] == text and dead["loss_nonfinite_since"] == 20
    assert fresh["loss"] is None and fresh["loss_nonfinite_since"] is None  # "no data yet" reads differently
    [line] = [line for line in render(run_root).splitlines() if line.startswith("dead")]
    assert f"finished, loss {text} since step 20" in line and f" {text} " in line.split("since step 20")[1]


def test_a_run_that_recovered_from_a_non_finite_loss_is_not_flagged(run_root: Path, slurm: FakeSlurm,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    write_run(run_root / "r", name="r", max_steps=30, losses=[3.0, float("nan"), 2.5], checkpoints={30: True})
    [row] = run_json(capsys, str(run_root / "r"))["rows"]
    assert row["loss"] == 2.5 and row["loss_nonfinite_since"] is None
    assert "since step" not in render(run_root / "r")


def test_run_root_rows_take_job_ids_from_its_sweeps(run_root: Path, slurm: FakeSlurm,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    make_sweep(run_root, slurm)
    write_run(run_root / "solo", name="solo", max_steps=5)
    rows = run_json(capsys, str(run_root))["rows"]
    assert sorted(r["name"] for r in rows) == ["run 0", "run 1", "run 2", "solo"]  # the sweep is not a row
    assert {r["name"]: r["job"] for r in rows} == {"run 0": "57_0", "run 1": "57_1", "run 2": "57_2",
                                                  "solo": "local"}


def test_without_slurm_clients_state_is_unknown(run_root: Path, slurm: FakeSlurm,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    sweep_dir, _ = make_sweep(run_root, slurm)
    slurm.remove("sacct")
    slurm.remove("squeue")
    out = run_json(capsys, str(sweep_dir))
    assert {r["state"] for r in out["rows"]} == {"unknown"}
    assert all(r["gpu_hours"] is None and r["requeues"] is None for r in out["rows"])
    assert out["total"]["gpu_hours"] is None
    assert "-" in render(sweep_dir)


def test_watch_stops_cleanly_on_ctrl_c(run_root: Path, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch) -> None:
    write_run(run_root / "r", name="r", max_steps=5)
    waits: list[float] = []

    def interrupted(seconds: float) -> None:
        waits.append(seconds)
        raise KeyboardInterrupt

    monkeypatch.setattr(status.time, "sleep", interrupted)
    assert status.main([str(run_root / "r"), "--watch", "3"]) == 0
    assert waits == [3.0]


@pytest.mark.parametrize("argv", [["--json", "--watch"], ["--watch", "0"]])
def test_bad_flags(run_root: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    write_run(run_root / "r", name="r", max_steps=5)
    assert status.main([str(run_root / "r"), *argv]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_bad_directory_is_one_line_and_exit_2(run_root: Path) -> None:
    (run_root / "empty dir").mkdir()
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "launcher.status", str(run_root / "empty dir")],
                         cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if not line.startswith("import time:")]
    assert len(errors) == 1 and errors[0].startswith("error: ") and "run.root" in errors[0]
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "contract.rundir.accounting" in imported and "torch" not in imported and "matplotlib" not in imported


# ---- a damaged config.yaml: shown with the launcher's way out, never hiding the other runs ----

DAMAGE = {"not yaml": "model: [unclosed\n  trainer: {", "empty": "", "cut short": "run:\n  name: x\n"}


def damage_run(run_dir: Path, text: str, copy: bool = True) -> None:
    """A run that trained to step 20 (a complete checkpoint holding the config's copy) whose config.yaml then broke."""
    write_run(run_dir, name=run_dir.name, max_steps=40, losses=[3.0, 2.0], checkpoints={20: True})
    if copy:
        (run_dir / "checkpoints" / "step_20" / "config.yaml").write_text((run_dir / "config.yaml").read_text())
    (run_dir / "config.yaml").write_text(text)
    (run_dir / "events.jsonl").write_text('{"kind": "finished", "step": 20}\n' * 2)


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_run_in_a_run_root_is_shown_with_its_restore_command(run_root: Path, slurm: FakeSlurm,
                                                                      capsys: pytest.CaptureFixture[str],
                                                                      damage: str) -> None:
    write_run(run_root / "good", name="good", max_steps=20, losses=[3.0, 2.0], checkpoints={20: True})
    damage_run(run_root / "d_noise", DAMAGE[damage])
    damage_run(run_root / "d_bare", DAMAGE[damage], copy=False)
    restore = (f"restore it from the newest checkpoint's copy (cp {run_root / 'd_noise/checkpoints/step_20/config.yaml'}"
               f" {run_root / 'd_noise/config.yaml'})")
    by_name = {r["name"]: r for r in run_json(capsys, str(run_root))["rows"]}
    assert {n: r["state"] for n, r in by_name.items()} == {"good": "finished", "d_noise": "damaged config",
                                                           "d_bare": "damaged config"}
    assert by_name["good"]["config_damage"] is None and by_name["good"]["step"] == 20
    assert by_name["d_noise"]["config_damage"].startswith(f"{run_root / 'd_noise/config.yaml'} is damaged (")
    assert by_name["d_noise"]["config_damage"].endswith(restore)
    assert by_name["d_bare"]["config_damage"].endswith("delete it (no checkpoint of this run holds a copy: the run "
                                                       "starts over)")
    text = render(run_root)
    assert "damaged config" in text and "good" in text and restore in " ".join(text.split())
    assert status.main([str(run_root)]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_run_given_directly_is_one_line_with_its_restore_command(run_root: Path, slurm: FakeSlurm,
                                                                           capsys: pytest.CaptureFixture[str],
                                                                           damage: str) -> None:
    """An empty config.yaml is no `stopped` run of `20/?` steps: the same refusal the launcher gives on resume."""
    run = run_root / "d_noise"
    damage_run(run, DAMAGE[damage])
    for argv in ([str(run)], [str(run), "--json"]):
        assert status.main(argv) == 2
        out = capsys.readouterr()
        assert out.out == "" and out.err.count("\n") == 1 and out.err.startswith(f"error: {run / 'config.yaml'} is damaged")
        assert f"(cp {run / 'checkpoints/step_20/config.yaml'} {run / 'config.yaml'})" in out.err


@pytest.mark.parametrize(("launcher_alive", "state"), [(True, "running"), (False, "crashed")])
def test_a_lost_replica_group_reads_running_while_its_launcher_starts_it_again(
        run_root: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str], launcher_alive: bool, state: str) -> None:
    """Group 0's rank died: the local launcher recorded the attempt's end (crashed) and is starting the group again.
    Until the new attempt starts (seconds: the ranks' imports), status says running while that launcher lives, and
    crashed once it is gone without a new attempt."""
    import os
    import socket

    from contract.rundir import replicas
    from contract.rundir.events import record_event

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # the dead rank 0, and a launcher that no longer runs
    run_dir = run_root / "groups"
    write_run(run_dir, name="groups", max_steps=40, losses=[3.0, 2.9], checkpoints={10: True})
    (run_dir / "local_attempts.txt").write_text(f"0 1.0 {socket.gethostname()} {gone.pid}\n")
    record_event(run_dir, "crashed", attempt=0, job=None, step=20, steps_lost=0, started=1.0, ended=30.0)
    record_event(run_dir, replicas.RESTARTING, group=0, launcher_pid=os.getpid() if launcher_alive else gone.pid,
                 host=socket.gethostname())
    out = run_json(capsys, str(run_root))
    assert {r["name"]: r["state"] for r in out["rows"]} == {"groups": state}
