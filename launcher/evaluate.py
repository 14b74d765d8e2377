"""python -m launcher.evaluate RUN_DIR [--step N | --best | --all] [eval.KEY=VALUE ...]
    [+cluster=NAME [cluster.KEY=VALUE ...]]

Evaluates a run's checkpoints after the fact: the validation sets (eval.sets, or the run's own) and the
lm-evaluation-harness tasks (eval.harness.*) on the weights of the newest complete checkpoint, of --step N, of the one
that measured best (--best, as export's and sample's), or of every complete checkpoint (--all), written by any number of ranks with any strategy. It runs what an evaluation job
runs (train/evaluation/job.py) with the run's config and these eval.* overrides: here, in one process, or with
+cluster=NAME as one SLURM job per checkpoint (eval.job_* sizes it). Each result goes to RUN_DIR/eval/step_N.json
(keys measured again replace theirs, the others stay) and launcher.status and launcher.report read it there.
Bad input (a step without a complete checkpoint, an unknown key, a task that can't run offline) is one `error:`
line, exit 2, with nothing run or queued.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from contract.errors import EXIT_BAD_INPUT, ConfigError
from contract.rundir import ckpt_layout as layout
from contract.rundir import eval_results
from launcher import compute_seam
from launcher.commands import CommandParser
from launcher.export import add_checkpoint_choice, pick_checkpoint, run_and_step
from launcher.sample import load_config


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="python -m launcher.evaluate", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="the run directory (RUN_ROOT/RUN_NAME), or one checkpoint "
                        "(RUN_DIR/checkpoints/step_N)")
    which = add_checkpoint_choice(parser)
    which.add_argument("--all", action="store_true", help="every complete checkpoint of the run")
    parser.add_argument("overrides", nargs="*", help="eval.KEY=VALUE (e.g. eval.harness.tasks=[TASK] "
                        "eval.harness.include_path=DIR eval.harness.limit=100), +cluster=NAME, cluster.KEY=VALUE")
    return parser


def split_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(eval.* overrides, +cluster=NAME and cluster.* overrides); anything else is refused."""
    evals, cluster = [], []
    for text in overrides:
        key = text.split("=", 1)[0].removeprefix("+")
        if key.startswith("eval."):
            evals.append(text)
        elif key == "cluster" or key.startswith("cluster."):
            cluster.append(text)
        else:
            raise ConfigError(f"{text}: launcher.evaluate takes eval.* overrides and +cluster=NAME (the rest is the "
                              "run's, as it trained)")
    if cluster and not any(t.split("=", 1)[0] == "+cluster" for t in cluster):
        raise ConfigError(f"{cluster[0]} without +cluster=NAME: name the cluster to evaluate on")
    return evals, cluster


def with_overrides(cfg: DictConfig, evals: list[str], cluster: list[str]) -> DictConfig:
    """The run's config with the eval.* overrides applied and, with +cluster=NAME, that cluster's section. Hydra
    composes them as `python -m launcher` does (its grammar, the schema's types and the checks of every key's
    range), and the keys they set are copied into the run's config."""
    from launcher.checks.key_checks import check_keys
    from launcher.compose import compose_config
    from launcher.plan.paths import make_absolute

    out = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    assert isinstance(out, DictConfig)
    try:
        composed = compose_config([*evals, *cluster])
    except Exception as err:  # Hydra's override and composition errors, worded as `python -m launcher` words them
        from launcher.checks.hydra_errors import one_line

        text = str(err) + (f"\n{err.__cause__}" if err.__cause__ is not None else "")
        raise ConfigError(one_line(text).removeprefix("error: ")) from None
    check_keys(composed)
    with open_dict(out):
        for text in evals:
            key = text.split("=", 1)[0].lstrip("+")
            OmegaConf.update(out, key, OmegaConf.select(composed, key), merge=False, force_add=True)
        if cluster:
            from launcher.checks.cluster_checks import validate_cluster

            out.cluster = composed.cluster
            validate_cluster(out)
    make_absolute(out)  # eval.sets.NAME.path and eval.harness.include_path typed here, against this directory
    return out


def check(cfg: DictConfig) -> None:
    """What a training launch checks of the evaluation, for a run that need not have validated."""
    from contract.rules.eval_sets import check_sets
    from contract.rules.harness import check_harness

    check_harness(cfg, standalone=True)
    check_sets(cfg)
    if cfg.cluster is not None:
        from contract.rules.eval_jobs import check_job_world
        from contract.rules.sbatch import tasks_per_node

        check_job_world(cfg, int(cfg.trainer.global_batch_size), tasks_per_node(cfg.cluster))


def checkpoints(args: argparse.Namespace, notes: list[str]) -> tuple[Path, list[layout.CheckpointDir]]:
    run_dir, step = run_and_step(args.run_dir.expanduser().resolve(), args.step)
    if not args.all:
        return run_dir, [pick_checkpoint(run_dir, step, args.best, notes)]
    found = [c for c in layout.list_checkpoints(run_dir) if c.complete] if run_dir.is_dir() else []
    if not found:
        pick_checkpoint(run_dir, None)  # says why
    return run_dir, found


def evaluate(args: argparse.Namespace) -> int:
    evals, cluster = split_overrides(args.overrides)
    notes: list[str] = []
    run_dir, chosen = checkpoints(args, notes)
    configs = {c.step: with_overrides(load_config(c.path), evals, cluster) for c in chosen}
    for cfg in configs.values():
        check(cfg)
    for line in notes:  # after the refusals: a refused evaluation is one line
        print(line, file=sys.stderr)
    status = 0
    for checkpoint in chosen:
        cfg = configs[checkpoint.step]
        path = eval_results.request_path(run_dir, checkpoint.step)
        path.parent.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, path)
        if cfg.cluster is not None:
            eval_results.mark_pending(run_dir, checkpoint.step)  # retention keeps the checkpoint for the job
            job = compute_seam.submit_evaluation(cfg, run_dir, checkpoint.step, path)
            print(f"evaluate: step {checkpoint.step}: submitted job {job}; its result: "
                  f"{eval_results.result_path(run_dir, checkpoint.step)}")
            continue
        print(f"evaluate: step {checkpoint.step} ({checkpoint.path}) here", file=sys.stderr)
        status = max(status, run_here(run_dir, checkpoint.step, path))
        if status == 0:
            print(f"evaluate: step {checkpoint.step}: {describe(run_dir, checkpoint.step)}")
    return status


def run_here(run_dir: Path, step: int, config: Path) -> int:
    """One process, as an evaluation job's rank: `python -m launcher.worker --evaluate RUN_DIR STEP CONFIG`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    return subprocess.run([sys.executable, "-m", "launcher.worker", "--evaluate", str(run_dir), str(step),
                           str(config)], env=env).returncode


def describe(run_dir: Path, step: int) -> str:
    from contract.rules.harness import describe as scores

    row: dict[str, Any] = next((r for r in eval_results.read_results(run_dir) if r["step"] == step), {})
    losses = " ".join(f"val/{name}/loss {loss:.4f}" for name, loss in eval_results.losses(row).items())
    return " ".join(part for part in (losses, scores(row)) if part) + \
        f" ({eval_results.result_path(run_dir, step)})"


def main(argv: list[str] | None = None) -> int:
    from launcher.run.remote.commands import forward_or_none

    if (remote_code := forward_or_none("launcher.evaluate", argv)) is not None:  # +remote=NAME or NAME:PATH
        return remote_code
    args = build_parser().parse_intermixed_args(argv)  # overrides before or after the flags
    try:
        return evaluate(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    from launcher.commands import run

    run(main)
