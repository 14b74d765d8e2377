"""Stability end to end (issue 22): a NaN in one rank's gradients is skipped, rolled back or stops the run as
stability.nonfinite says, and the stop line's command resumes past it; a rollback's skipped samples stay skipped
across a requeue; optim.lr=1e4 is caught with no non-finite checkpoint; a loss blown far above its start (optim.lr=10)
is never rolled back to and the stop line starts over at a 100x lower rate (issue 27); a spike batch is skipped
under the spike rule; z-loss resumes bitwise.

Runs are shared through module fixtures and started two at a time (the tier's time is the launches)."""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from launcher import status
from tests.conftest import ROOT, hq, launch, launcher_env, read_metrics
from tests.dist.store import hosted_port
from train.step import TRACE_SAMPLES_ENV

pytestmark = pytest.mark.dist

COMMON = ["trainer.log_every=1", "logger.backend=none", "trainer.progress_bar=false"]
NAN_STEP = 7  # on rank 1; two ranks of micro batch 8: step 7 reads samples [96, 112)


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def _trace(trace_dir: Path) -> list[tuple[int, list[int]]]:
    """(step, samples) in the order rank 0 trained them, replays included."""
    lines = (trace_dir / "rank0_world2.txt").read_text().splitlines()
    return [(int(head), [int(x) for x in rest.split()]) for head, _, rest in (ln.partition(" ") for ln in lines)]


@pytest.fixture(scope="module")
def rollback_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`whole`: a NaN at step 7 rolls back to step 6 in-process; `requeued`: the same, but a stop signal at the same
    step ends the attempt right after the rollback, and the same command resumes. Both train with z-loss."""
    root = tmp_path_factory.mktemp("rollback") / "runs with space's"
    root.mkdir()
    common = [*COMMON, f"run.root={hq(root)}", "local.nproc=2", "trainer.max_steps=12", "trainer.ckpt_every=3",
              "stability.nonfinite=rollback", "optim.z_loss=1e-4"]
    traces = {name: root / f"trace-{name}" for name in ("whole", "requeued")}
    for t in traces.values():
        t.mkdir()
    fault = {"SLURMTRAIN_TEST_NAN_GRAD": f"{NAN_STEP}:1"}
    with ThreadPoolExecutor(2) as pool:
        whole = pool.submit(launch, *common, "run.name=whole", **fault, **{TRACE_SAMPLES_ENV: str(traces["whole"])})
        first = launch(*common, "run.name=requeued", **fault, SLURMTRAIN_TEST_SIGNAL=f"{NAN_STEP}:0",
                       **{TRACE_SAMPLES_ENV: str(traces["requeued"])})
        # The injector fires at its step in a new process whatever the samples: the resume runs without it, as a
        # resume after a real bad batch would (which only its samples carry).
        second = launch(*common, "run.name=requeued", **{TRACE_SAMPLES_ENV: str(traces["requeued"])})
        yield {"root": root, "whole": whole.result(), "first": first, "second": second, "traces": traces}


def test_rollback_resumes_from_the_checkpoint_before_the_nan_and_skips_its_samples(rollback_runs: dict) -> None:
    out, run_dir = rollback_runs["whole"], rollback_runs["root"] / "whole"
    assert out.returncode == 0, out.stderr[-3000:]
    rollback = [e for e in _events(run_dir) if e["kind"] == "rollback"]
    assert len(rollback) == 1 and rollback[0]["step"] == NAN_STEP and rollback[0]["to_step"] == 6
    assert rollback[0]["skipped"] == [[96, 112]]
    assert [e["kind"] for e in _events(run_dir)][-1] == "finished"
    assert json.loads((run_dir / "skipped_samples.json").read_text())["ranges"][0][:2] == [96, 112]
    trace = _trace(rollback_runs["traces"]["whole"])
    steps = [s for s, _ in trace]
    assert steps == [*range(1, 8), *range(7, 13)]  # step 7 once, rolled back, then 7 to 12 again
    assert trace[6][1][0] == 96  # the first step 7 read the bad batch ...
    replayed = [x for _, samples in trace[7:] for x in samples]
    assert replayed[0] == 112 and not set(range(96, 112)) & set(replayed)  # ... which no later step reads
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 13))  # the abandoned step's row is redone, once
    assert all("z_loss" in r and 0 < r["z_loss"] < 1 for r in rows)


def test_a_requeue_after_a_rollback_skips_the_recorded_samples_and_ends_bitwise_alike(rollback_runs: dict) -> None:
    first, second = rollback_runs["first"], rollback_runs["second"]
    assert first.returncode == 75, first.stderr[-3000:]  # rolled back, then stopped at the checkpoint of step 6
    assert second.returncode == 0, second.stderr[-3000:]
    resumed = [(s, x) for s, x in _trace(rollback_runs["traces"]["requeued"])]
    assert resumed[7] == (7, list(range(112, 120)))  # the second attempt read the file: step 7 starts past them
    whole, requeued = (read_metrics(rollback_runs["root"] / n) for n in ("whole", "requeued"))
    # Bitwise: the in-process rollback and the resume of a new process train the same steps on the same samples,
    # z-loss included.
    assert [(r["loss"], r["z_loss"]) for r in whole] == [(r["loss"], r["z_loss"]) for r in requeued]


@pytest.fixture(scope="module")
def stop_and_lr_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("stop") / "runs"
    root.mkdir()
    with ThreadPoolExecutor(2) as pool:
        stop = pool.submit(launch, *COMMON, f"run.root={hq(root)}", "run.name=stop", "local.nproc=2",
                           "trainer.max_steps=12", "trainer.ckpt_every=3", "stability.nonfinite=stop",
                           SLURMTRAIN_TEST_NAN_GRAD=f"{NAN_STEP}:1")
        # A 4096-token vocabulary at optim.lr=10: the loss goes from ln(4096) = 8.3 to hundreds within two steps,
        # finite; a NaN at step 7 then asks for a rollback, to checkpoints that all hold the blown loss.
        blown = pool.submit(launch, *COMMON, f"run.root={hq(root)}", "run.name=blown", "local.nproc=1",
                            "model.vocab_size=4096", "optim.lr=10", "trainer.max_steps=8", "trainer.ckpt_every=2",
                            "stability.nonfinite=rollback", SLURMTRAIN_TEST_NAN_GRAD=f"{NAN_STEP}:0")
        high = launch(*COMMON, f"run.root={hq(root)}", "run.name=lr", "local.nproc=1", "trainer.max_steps=30",
                      "trainer.ckpt_every=2", "optim.lr=1e4")
        yield {"root": root, "stop": stop.result(), "lr": high, "blown": blown.result()}


def test_stop_checkpoints_nothing_after_the_step_and_names_it_in_one_line(stop_and_lr_runs: dict) -> None:
    out, run_dir = stop_and_lr_runs["stop"], stop_and_lr_runs["root"] / "stop"
    assert out.returncode == 76, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"error: stopped at step {NAN_STEP}: "), out.stderr[-3000:]
    assert "one bad batch" in errors[0] and "from the last checkpoint (step 6" in errors[0]
    assert "failed" not in out.stderr and "lower learning rate" not in errors[0]
    assert sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*")) == [3, 6]
    assert _events(run_dir)[-1]["kind"] == "diverged"
    # The command it gives works as written: the same run resumed from step 6, the bad batch (it comes again) not
    # applied, on to the end at the same rate.
    command = errors[0].split("at the same rate: ", 1)[1].split(" (or stability.nonfinite=")[0]
    assert "stability.nonfinite=skip" in shlex.split(command)
    again = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env=launcher_env(SLURMTRAIN_TEST_NAN_GRAD=f"{NAN_STEP}:1"))
    assert again.returncode == 0, again.stderr[-3000:]
    ends = [e for e in _events(run_dir) if e["kind"] in ("skipped_step", "diverged", "finished")]
    assert [(e["kind"], e["step"]) for e in ends] == [("skipped_step", NAN_STEP), ("diverged", NAN_STEP),
                                                       ("skipped_step", NAN_STEP), ("finished", 12)]
    assert read_metrics(run_dir)[-1]["step"] == 12


def _finite_checkpoint(path: Path) -> bool:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    flat = path / "flat.pt"
    dcp_to_torch_save(path / "model_optim", flat)
    tensors: list[torch.Tensor] = []

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            tensors.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list | tuple):
            for v in x:
                walk(v)

    walk(torch.load(flat, weights_only=False))
    flat.unlink()
    return bool(tensors) and all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())


def test_a_learning_rate_of_1e4_is_caught_within_a_few_steps_and_no_checkpoint_holds_nonfinite_values(
        stop_and_lr_runs: dict) -> None:
    out, run_dir = stop_and_lr_runs["lr"], stop_and_lr_runs["root"] / "lr"
    assert out.returncode == 76, out.stderr[-3000:]
    first_skip = min(e["step"] for e in _events(run_dir) if e["kind"] == "skipped_step")
    assert first_skip <= 8
    # The model collapsed (loss ln(vocab), no gradient: each marker says so): no checkpoint of it is a rollback
    # target, and the advice starts over 10x lower rather than going round from them (issue 27's trial).
    assert "its loss sits at a random model's" in out.stderr and "last good checkpoint" not in out.stderr
    assert "with a lower learning rate (10x lower)" in out.stderr and "optim.lr=1000 run.overwrite=true" in out.stderr
    assert not [e for e in _events(run_dir) if e["kind"] == "rollback"]
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
    assert checkpoints and all(_finite_checkpoint(c) for c in checkpoints)


def test_a_loss_blown_far_above_its_start_is_never_rolled_back_to_and_starts_over_10x_lower_or_more(
        stop_and_lr_runs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    out, run_dir = stop_and_lr_runs["blown"], stop_and_lr_runs["root"] / "blown"
    assert out.returncode == 76, out.stderr[-3000:]
    rows = read_metrics(run_dir)
    assert rows[0]["loss"] < 9 and all(r["loss"] > 20 for r in rows[1:])  # it blew up for real, finite
    markers = [json.loads((c / "COMPLETE").read_text()) for c in sorted((run_dir / "checkpoints").glob("step_*"))]
    assert [m["step"] for m in markers] == [2, 4, 6] and all(m["loss"] > 20 for m in markers)
    assert not [e for e in _events(run_dir) if e["kind"] == "rollback"]  # none of them was a target
    [line] = [line for line in out.stderr.splitlines() if "error:" in line]
    assert "no good checkpoint from before the trouble" in line and "far above its start" in line
    assert "(steps 2, 4, 6: its loss is far above the best)" in line
    args = shlex.split(line.split("with a lower learning rate (", 1)[1].split("): ", 1)[1])
    lr = float(next(a for a in args if a.startswith("optim.lr=")).split("=")[1])
    assert lr <= 1 and "run.overwrite=true" in args and not any(a.startswith("model.init_from=") for a in args)
    assert status.main([str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["loss_blown_since"] == 2


SPIKE_STEP = 38
SPIKE_RULE = ["stability.spike_sigma=6", "stability.spike_window=20"]


def test_a_spike_batch_is_skipped_and_the_final_loss_stays_within_1_percent(tmp_path: Path) -> None:
    common = [*COMMON, f"run.root={hq(tmp_path)}", "local.nproc=1", "trainer.max_steps=40", *SPIKE_RULE]
    with ThreadPoolExecutor(1) as pool:
        clean = pool.submit(launch, *common, "run.name=clean")
        spiked = launch(*common, "run.name=spiked", SLURMTRAIN_TEST_SPIKE_BATCH=str(SPIKE_STEP))
        assert clean.result().returncode == 0 and spiked.returncode == 0, spiked.stderr[-3000:]
    skipped = {e["step"]: e["reason"] for e in _events(tmp_path / "spiked") if e["kind"] == "skipped_step"}
    assert skipped.get(SPIKE_STEP) == "spike"
    assert SPIKE_STEP not in {e["step"] for e in _events(tmp_path / "clean") if e["kind"] == "skipped_step"}
    rows = {n: read_metrics(tmp_path / n) for n in ("clean", "spiked")}
    assert rows["spiked"][SPIKE_STEP - 1]["loss"] > 1.5 * rows["clean"][SPIKE_STEP - 1]["loss"]  # it was a spike
    assert rows["spiked"][-1]["spikes"] == rows["clean"][-1]["spikes"] + 1
    assert rows["spiked"][-1]["loss"] == pytest.approx(rows["clean"][-1]["loss"], rel=0.01)


def skip_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """One run of 10 steps with rank 1's gradients NaN at step 7; each rank saves its weights as steps 7 and 8
    start (after step 6, after step 7)."""
    from launcher.compose import compose_and_plan
    from tests.dist.workers import _join
    from train import distributed
    from train.loop import train
    from train.stability import faults
    from train.stability.runner import Stability

    env = _join(rank, world, port)
    faults.NAN_AT = {(NAN_STEP, 1)}
    step_start = Stability.step_start

    def snapshot(self: Stability, step: int, position: int) -> int:
        if step in (NAN_STEP, NAN_STEP + 1):
            flat = torch.cat([p.detach().flatten() for p in self.strategy.model.parameters()])
            torch.save(flat, Path(out_dir) / f"rank{rank}_before_step{step}.pt")
        return step_start(self, step, position)

    Stability.step_start = snapshot  # type: ignore[method-assign]
    try:
        cfg, _ = compose_and_plan([f"local.nproc={world}", *COMMON, "trainer.max_steps=10", "trainer.ckpt_every=0"])
        train(cfg, env, torch.device("cpu"), Path(out_dir))
    finally:
        distributed.destroy_process_group()


def test_skip_leaves_every_ranks_weights_as_they_were_and_training_goes_on(tmp_path: Path) -> None:
    mp.spawn(skip_worker, args=(2, hosted_port(2), str(tmp_path)), nprocs=2)
    for rank in range(2):
        before, after = (torch.load(tmp_path / f"rank{rank}_before_step{s}.pt") for s in (NAN_STEP, NAN_STEP + 1))
        assert torch.equal(before, after)
    skipped = [e for e in _events(tmp_path) if e["kind"] == "skipped_step"]
    assert [(e["step"], e["reason"], e["samples"]) for e in skipped] == [(NAN_STEP, "nonfinite", [96, 112])]
    rows = read_metrics(tmp_path)
    assert rows[-1]["step"] == 10 and rows[-1]["skipped_steps"] == 1 and rows[-1]["loss"] < rows[0]["loss"]
    assert rows[NAN_STEP]["grad_norm"] == rows[NAN_STEP]["grad_norm"]  # finite again after the skipped step
