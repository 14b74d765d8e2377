"""Evaluation jobs' torch-free parts (eval.async_jobs): which steps get a job, the launch refusals, the job's script
and environment, the result and pending files, and retention's respect for a pending evaluation."""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from contract.config.schema import EvalConfig
from contract.errors import ConfigError
from contract.rules.eval_jobs import evaluated_step, tasks_per_node
from contract.rundir import eval_results
from launcher.checks.key_checks import suggest
from launcher.compose import compose_and_plan
from launcher.plan.world import tasks_per_node as cluster_tasks_per_node
from tests.conftest import launch
from train.evaluation.submit import clean_environment, render_script

CLUSTER = ["+cluster=local_slurm", "run.root=/tmp/x", "eval.async_jobs=true"]


def test_the_evaluated_steps_are_each_periodic_checkpoint_and_the_last() -> None:
    cfg = OmegaConf.create({"trainer": {"ckpt_every": 3, "max_steps": 10}})
    assert [s for s in range(0, 12) if evaluated_step(cfg, s)] == [3, 6, 9, 10]
    cfg.trainer.ckpt_every = 0  # only the final checkpoint
    assert [s for s in range(0, 12) if evaluated_step(cfg, s)] == [10]


@pytest.mark.parametrize(("overrides", "expected"), [
    (["eval.every=5"], r"eval.every=5 with eval.async_jobs=true: .* set trainer.ckpt_every=5"),
    (["eval.job_tasks_per_node=3"], r"the evaluation job's 3 data-parallel ranks .* do not divide the global batch 16"),
    (["parallel.pp=2", "model.tie_embeddings=false"], r"eval.async_jobs=true with parallel.pp=2: .* "
                                                       r"set eval.async_jobs=false"),
])
def test_what_cannot_work_is_refused_at_launch(overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        compose_and_plan([*CLUSTER, *overrides])


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_a_zero_checkpoint_is_evaluated_on_fewer_ranks_than_wrote_it(strategy: str) -> None:
    # The job loads only the weights (train/init_weights.load_into), so a DeepSpeed checkpoint of the training job's
    # 2 ranks loads on the job's 1 (tests/dist/test_eval_job_load.py): the launch check accepts it.
    cfg, plan = compose_and_plan([*CLUSTER, f"strategy={strategy}"])
    job_ranks = int(cfg.eval.job_nodes) * tasks_per_node(cfg, cluster_tasks_per_node(cfg.cluster))
    assert (plan.world_size, job_ranks) == (2, 1)
    assert plan.refusal == "" and cfg.strategy.name == strategy


def test_a_local_run_is_refused_in_one_line_and_nothing_is_created(tmp_path: Path) -> None:
    out = launch("eval.async_jobs=true", f"run.root={tmp_path / 'runs'}", "run.name=r")
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: eval.async_jobs=true submits an evaluation job per checkpoint and needs a SLURM cluster: "
                      "add +cluster=NAME, or evaluate in the loop with eval.every=N instead"], out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "runs").exists()


def test_eval_async_as_the_issue_spells_it_points_to_the_key() -> None:
    # `async` is a Python keyword, so no schema field can be named so: the refusal of eval.async names the key.
    keys = [f.name for f in dataclasses.fields(EvalConfig)]
    assert suggest("eval.async", keys) == "eval.async_jobs"


def test_the_job_script_has_its_own_resources_and_the_training_jobs_preemption_settings(tmp_path: Path) -> None:
    cfg, _ = compose_and_plan([*CLUSTER, "run.name=r", "eval.job_partition=evalq", "eval.job_qos=low",
                               "eval.job_tasks_per_node=2", "eval.job_time_limit_min=7", "cluster.qos=high"])
    run_dir = tmp_path / "run dir's"
    script = render_script(cfg, run_dir, 40)
    for line in ("#SBATCH --partition=evalq", "#SBATCH --qos=low", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=2",
                 "#SBATCH --time=7", "#SBATCH --requeue", "#SBATCH --signal=USR1@90", "#SBATCH --job-name=r-eval40",
                 "export GLOO_SOCKET_IFNAME=lo"):
        assert line in script.splitlines(), (line, script)
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert shlex.split(srun)[-5:] == ["-m", "launcher.worker", "--evaluate", str(run_dir.resolve()), "40"]
    # Unset, the job takes the cluster's settings.
    cfg, _ = compose_and_plan([*CLUSTER, "run.name=r"])
    defaults = render_script(cfg, run_dir, 40).splitlines()
    assert "#SBATCH --partition=debug" in defaults and "#SBATCH --time=30" in defaults
    assert "#SBATCH --ntasks-per-node=1" in defaults


def test_the_job_inherits_nothing_of_the_training_jobs_slurm_or_torch_environment() -> None:
    env = {"PATH": "/bin", "SLURM_CONF": "/etc/slurm.conf", "SLURM_JOB_ID": "7", "SLURM_PROCID": "1",
           "SBATCH_PARTITION": "x", "SUBMITIT_FOLDER": "/f", "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "n1",
           "CUDA_VISIBLE_DEVICES": "3", "SLURMTRAIN_TEST_EVAL_HOLD": "4", "WANDB_MODE": "offline"}
    assert clean_environment(env) == {"PATH": "/bin", "SLURM_CONF": "/etc/slurm.conf",
                                      "SLURMTRAIN_TEST_EVAL_HOLD": "4", "WANDB_MODE": "offline"}


def test_a_pending_marker_is_taken_once_and_a_result_is_written_whole(tmp_path: Path) -> None:
    assert eval_results.mark_pending(tmp_path, 4)
    assert not eval_results.mark_pending(tmp_path, 4)  # the same checkpoint is evaluated once
    assert eval_results.awaiting_evaluation(tmp_path, 4) and eval_results.pending_steps(tmp_path) == [4]
    path = eval_results.write_result(tmp_path, 4, {"val/val/loss": 2.5, "val/code/loss": math.nan,
                                                   "val/val/ppl": math.exp(2.5)}, job="12", world_size=2)
    eval_results.clear_pending(tmp_path, 4)
    assert not eval_results.awaiting_evaluation(tmp_path, 4)
    assert not eval_results.mark_pending(tmp_path, 4)  # it has its result
    row = json.loads(path.read_text())  # strict JSON: nan as text, as in metrics.jsonl
    assert row["val/code/loss"] == "nan" and row["step"] == 4 and row["job"] == "12"
    assert [p.name for p in eval_results.eval_dir(tmp_path).iterdir()] == ["step_4.json"]  # no temporary left


def test_results_read_in_step_order_and_the_status_line_names_the_newest(tmp_path: Path) -> None:
    for step, loss in ((10, 3.0), (2, 4.0)):
        eval_results.write_result(tmp_path, step, {"val/val/loss": loss, "val/val/ppl": math.exp(loss)}, job=str(step))
    (eval_results.eval_dir(tmp_path) / "step_13.json").write_text('{"step": 13, "val/val')  # not JSON: skipped
    eval_results.mark_pending(tmp_path, 12)
    assert [r["step"] for r in eval_results.read_results(tmp_path)] == [2, 10]
    summary = eval_results.summary(tmp_path)
    assert summary == {"step": 10, "losses": {"val": 3.0}, "job": "10", "pending": [12]}
    assert eval_results.describe(summary) == "evaluation jobs: step 10 val 3.0000 (job 10); awaiting 12"
    assert eval_results.summary(tmp_path / "none") is None


def test_retention_keeps_a_checkpoint_until_its_evaluation_is_done(tmp_path: Path) -> None:
    from contract.rundir import ckpt_layout as layout
    from train.checkpoints.retention import doomed_checkpoints

    for step in (2, 4, 6):
        path = layout.step_dir(tmp_path, step)
        path.mkdir(parents=True)
        layout.write_marker(path, step=step)
    keep = OmegaConf.create({"keep_last": 1, "keep_every": 0})
    eval_results.mark_pending(tmp_path, 2)
    assert [c.step for c in doomed_checkpoints(tmp_path, keep)] == [4]
    eval_results.clear_pending(tmp_path, 2)
    assert [c.step for c in doomed_checkpoints(tmp_path, keep)] == [2, 4]
