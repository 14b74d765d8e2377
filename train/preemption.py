"""signal -> flag -> agreement across ranks -> save -> requeue -> exit.

The handler only sets a flag. At every step boundary the ranks agree on the flag with one tiny all-reduce, so
all of them stop at the same step even if the signal reached them at different moments, or reached one alone.
The caller then saves synchronously; under SLURM rank 0 requeues the job (the array task alone, for arrays).
"""

from __future__ import annotations

import os
import signal
import subprocess
from types import FrameType
from typing import Any

import torch

from launcher.errors import EXIT_STOPPED
from train.distributed import DistEnv, any_rank
from train.metrics import log

# Fault injection for tests: "STEP:RANK" makes RANK send itself the preemption signal after STEP.
TEST_SIGNAL_ENV = "SLURMTRAIN_TEST_SIGNAL"


class RequeueLimitReached(RuntimeError):
    pass


def signal_number(name: str) -> int:
    name = name.upper()
    return int(getattr(signal, name if name.startswith("SIG") else f"SIG{name}"))


class PreemptionWatcher:
    def __init__(self, env: DistEnv, device: torch.device, signal_name: str = "USR1") -> None:
        self.env, self.device = env, device
        self.signum = signal_number(signal_name)
        self.received: int | None = None
        self._previous = signal.signal(self.signum, self._on_signal)
        self._test_trigger = self._parse_test_trigger()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Nothing else here: saving inside a handler would race the training step and the other ranks.
        self.received = signum

    def _parse_test_trigger(self) -> tuple[int, int] | None:
        spec = os.environ.get(TEST_SIGNAL_ENV)
        if not spec:
            return None
        step, rank = spec.split(":")
        return int(step), int(rank)

    def stop_requested(self, step: int) -> bool:
        """Collective: every rank must call it at every step boundary."""
        if self._test_trigger == (step, self.env.rank):
            os.kill(os.getpid(), self.signum)
        return any_rank(self.received is not None, self.device)

    def close(self) -> None:
        signal.signal(self.signum, self._previous)


def slurm_job_id() -> str | None:
    if os.environ.get("SLURM_ARRAY_JOB_ID") and os.environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def after_stop(env: DistEnv, cfg: Any, step: int) -> int:
    """Called on every rank once the stop checkpoint is complete; returns the worker's exit code."""
    job_id = slurm_job_id()
    if env.launcher != "slurm" or job_id is None:
        if env.is_main:
            log.info("stopped at step %d with a complete checkpoint; run the same command to resume", step)
        return EXIT_STOPPED
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    limit = cfg.cluster.max_requeues if cfg.cluster is not None else 0
    if restarts >= limit:
        raise RequeueLimitReached(
            f"checkpointed at step {step}, but job {job_id} was already requeued {restarts} times "
            f"(cluster.max_requeues={limit}): resubmit the same command to resume, or raise cluster.max_requeues"
        )
    if env.is_main:
        log.info("checkpointed at step %d; requeueing job %s (restart %d of at most %d)", step, job_id,
                 restarts + 1, limit)
        out = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"scontrol requeue {job_id} failed: {out.stderr.strip()}")
    return 0
