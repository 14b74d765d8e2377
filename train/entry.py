"""run(cfg): the callable that submitit pickles, the target of local workers, and usable under torchrun.

    python -m train.entry --config RUN_DIR/config.yaml
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf


def load_config(path: str | Path) -> Any:
    # The resolved config is the contract with the launcher; merging it into the schema re-checks its keys.
    from contract.config.schema import Config

    return OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(path))


TORCHRUN_UNDER_SLURM = (
    "error: torchrun under SLURM is not supported: SLURM sends the preemption signal to every process of the "
    "step, and torchrun's agent dies of it before the ranks can checkpoint. Start one srun task per GPU instead: "
    "sbatch sbatch/multi_node.sbatch, or python -m launcher +cluster=NAME"
)


def check_launch(environ: dict[str, str]) -> None:
    if "TORCHELASTIC_RUN_ID" in environ and "SLURM_JOB_ID" in environ:
        print(TORCHRUN_UNDER_SLURM, file=sys.stderr)
        raise SystemExit(2)


def run(config_path: str | Path) -> int:
    started = time.time()
    from contract.terminal import outlive_terminal

    # First: a terminal that goes away (`| head`, a dropped SSH session) must not end the rank, nor change its outcome.
    outlive_terminal()
    check_launch(dict(os.environ))
    cfg = load_config(config_path)
    from train.faults.signals import StopFlag, preempt_signal

    # Before the heavy imports: a signal during start-up or a checkpoint load is remembered, not fatal.
    flag = StopFlag(preempt_signal(cfg))
    import torch

    from contract.errors import EXIT_BAD_INPUT, ConfigError
    from train import distributed
    from train.faults.preemption import RequeueLimitReached, requeue
    from train.faults.recovery import begin_attempt, end_of_attempt, log_failure, recover
    from train.faults.watchdog import Watchdog
    from train.loop import train
    from train.observe.metrics import log, setup_logging

    run_dir = Path(config_path).resolve().parent
    env = distributed.detect()
    setup_logging(env)
    outlive_terminal(on_gone=terminal_gone)
    begin_attempt(run_dir, env.is_main)
    # Reproducible CPU math needs a fixed thread count; it is a config value, not a property of the host.
    torch.set_num_threads(cfg.trainer.cpu_threads)
    if cfg.trainer.deterministic:
        deterministic_algorithms()
    backend = distributed.pick_backend(cfg.local.backend if env.launcher == "local" else _cluster_backend(cfg))
    device = distributed.device_for(env, backend)

    def on_hang(section: str, elapsed: float, step: int, host: str | None) -> None:
        recover(cfg, run_dir, "hung", step, host, started=started, is_main=env.is_main)

    watchdog = Watchdog(cfg, env.rank, env.world_size, run_dir, on_hang)
    try:
        distributed.apply_nccl_env(cfg.cluster, run_dir, backend)
        distributed.init_process_group(env, backend, timeout_s=int(cfg.watchdog.startup_timeout_s))
        # Every rank says where it runs: the first thing to read when a multi-node job hangs.
        log.info("joined via %s: backend %s, device %s, master %s:%d, pid %d", env.launcher, backend, device,
                 env.master_addr, env.master_port, os.getpid())
        hosts = distributed.gather_hosts(env)
        if env.is_main:
            log.info("world of %d ranks on %d host(s): %s", env.world_size, len(set(hosts)), ", ".join(hosts))
        result = train(cfg, env, device, run_dir, flag, hosts, watchdog)
    except RequeueLimitReached as err:
        log.error("%s", err)
        raise
    except ConfigError as err:
        # Bad input that only shows on the ranks (a dataset, a model): one line, exit 2, never retried.
        log.error("error: %s", err)
        print(f"error: {err}", file=sys.stderr)
        # An exit, not a return value: submitit would report a returned code as a completed job.
        raise SystemExit(EXIT_BAD_INPUT) from None
    except BaseException as err:
        if watchdog.fired:
            watchdog.let_it_finish()  # a hang, being handled: the collective failed because a peer already left
        if not isinstance(err, (KeyboardInterrupt, SystemExit)):
            end_if_environment(err, run_dir, env, watchdog.last_step, started)
        kept_off_terminal = log_failure(err)
        if not isinstance(err, KeyboardInterrupt):
            try:
                recover(cfg, run_dir, "crashed", watchdog.last_step, env.node, err, started=started,
                        is_main=env.is_main)
            except OSError as unrecorded:  # the run directory went away (a peer says so) or takes no write
                log.warning("the failure was not recorded in %s: %s", run_dir, unrecorded)
        if kept_off_terminal:
            raise SystemExit(1) from None  # an uncaught error would print its traceback on the terminal again
        raise
    finally:
        watchdog.close()
        distributed.destroy_process_group()
        flag.close()
    try:
        requeue_job = end_of_attempt(run_dir, result.outcome, result.state.step, started) if env.is_main else None
    except OSError as err:  # recording the end: a full disk or a vanished run directory
        end_if_environment(err, run_dir, env, result.state.step, started)
        raise
    if requeue_job:
        requeue(requeue_job)  # last: it ends this attempt
    return result.outcome.exit_code


def end_if_environment(err: BaseException, run_dir: Path, env: Any, step: int, started: float) -> None:
    """A failure from outside the code ends in one line and its own exit code (contract/rundir/environment.py)."""
    from contract.rundir.environment import EXIT_ENVIRONMENT, classify
    from train.faults.recovery import end_for_environment, node_name

    ending = classify(err, run_dir, rank=env.rank, host=node_name(), step=step)
    if ending is not None:
        end_for_environment(run_dir, ending, err, rank=env.rank, step=step, started=started)
        raise SystemExit(EXIT_ENVIRONMENT) from None


def terminal_gone(stream: str) -> None:
    """Said once, in the rank's log file (contract/terminal.py): where its output goes on."""
    from train.faults.recovery import _to_rank_log

    _to_rank_log(logging.WARNING, f"the terminal went away ({stream}: its reader closed or it hung up); training "
                 "goes on, its output goes on in this log file", None)


def _cluster_backend(cfg: Any) -> str | None:
    if cfg.cluster is None:
        return None
    return cfg.cluster.backend


def deterministic_algorithms() -> None:
    """torch.use_deterministic_algorithms(True, warn_only=True), without importing inductor (a CPU-second on every
    rank's start): the public call imports it only to set its `deterministic` flag, which inductor also reads from
    TORCHINDUCTOR_DETERMINISTIC when a compiled run (strategy.compile) first imports it."""
    import torch

    if "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(True, warn_only=True)
        return
    os.environ["TORCHINDUCTOR_DETERMINISTIC"] = "1"
    torch._C._set_deterministic_algorithms(True, warn_only=True)


def preload() -> None:
    """Import what every rank imports: run()'s imports below, and those its first step and first save make (torch.optim
    imports torch._dynamo at the first step). Local ranks are forked from a process that called this
    (launcher/run/rank_fork.py), so that a run pays these imports once, not once per rank."""
    import torch._dynamo  # noqa: F401
    import torch.distributed.checkpoint._fsspec_filesystem  # noqa: F401

    import train.faults.preemption  # noqa: F401
    import train.faults.recovery  # noqa: F401
    import train.faults.signals  # noqa: F401
    import train.faults.watchdog  # noqa: F401
    import train.loop  # noqa: F401
    import train.model.transformer  # noqa: F401
    import train.observe.metrics  # noqa: F401
    import train.strategies.mesh  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="resolved config.yaml in the run directory")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return run(args.config)


if __name__ == "__main__":
    sys.exit(main())
