"""Tensor parallelism on the real local cluster: 2 nodes x 2 tasks, tp=2 x dp=2. Both tensor-parallel ranks of a
replica land on one node (the log shows the mapping); USR1 preempts it, it requeues itself and ends with the
losses of an uninterrupted run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import hq, launch, read_metrics
from tests.slurm.helpers import preempt_and_release, submitted_job_id

pytestmark = pytest.mark.slurm

STEPS = 30
COMMON = [f"trainer.max_steps={STEPS}", "trainer.log_every=1", "trainer.ckpt_every=10", "strategy=fsdp",
          "parallel.tp=2", "model.tie_embeddings=false", "trainer.global_batch_size=16",
          "logger.backend=none"]


def test_tp2_x_dp2_lands_tensor_parallel_pairs_on_one_node_and_survives_a_preemption(run_root: Path) -> None:
    reference = launch(*COMMON, "local.nproc=4", f"run.root={hq(run_root)}", "run.name=ref")
    assert reference.returncode == 0, reference.stderr[-3000:]
    out = launch(*COMMON, "+cluster=local_slurm", "cluster.nodes=2", "cluster.tasks_per_node=2",
                 f"run.root={hq(run_root)}", "run.name=tp")
    assert out.returncode == 0, out.stderr
    assert "node 0: ranks 0-1: dp 0 stage 0 tp 0-1" in out.stderr and "node 1: ranks 2-3: dp 1 stage 0 tp 0-1" in out.stderr
    job_id = submitted_job_id(out.stdout)
    run_dir = run_root / "tp"
    assert preempt_and_release(job_id, run_dir) == "COMPLETED"
    log = (run_dir / "slurm" / f"{job_id}_0_log.err").read_text()
    layouts = re.findall(r"layout: tp 2 x pp 1 x dp 2: (.*)", log)
    assert len(layouts) == 2, log[-3000:]  # once per attempt
    for line in layouts:
        placed = dict(re.findall(r"rank (\d) (\S+) \(dp \d, stage 0, tp \d\)", line))
        assert placed["0"] == placed["1"] != placed["2"] == placed["3"], line
    assert re.search(r"resumed from .*step_(\d+)", log), log[-3000:]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in rows] == [r["loss"] for r in read_metrics(run_root / "ref")]
