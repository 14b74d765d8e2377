"""signal -> flag -> agreement across ranks -> save -> requeue -> exit.

The handlers (train/faults/signals.py) only set a flag. At every step boundary the ranks agree on the flag with one tiny
all-reduce, so all of them stop at the same step even if the signal reached them at different moments, or reached
one alone. The caller then saves synchronously and, once everything is closed, rank 0 requeues the job under
SLURM (the array task alone, for arrays).
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from contract.config.schema import ClusterConfig
from contract.container.requeue import ask_host
from contract.errors import EXIT_STOPPED
from contract.rundir.replicas import GROUP_ENV
from train.distributed import DistEnv, cpu_group
from train.faults.signals import StopFlag, signal_number
from train.observe.metrics import log
from train.observe.sync_count import host_values

# Fault injection for tests: "STEP:RANK" makes RANK send itself the preemption signal after STEP; "STEP:RANK:parent"
# sends it to the rank's parent instead (a search worker, launcher/sweeps/search_worker.py, which forwards it);
# ":group=K" fires in replica group K only (each group has a rank RANK); ":signal=TERM" sends SIGTERM instead.
TEST_SIGNAL_ENV = "SLURMTRAIN_TEST_SIGNAL"
# Fault injection for tests: "RANK" dies (SIGKILL) at its first step boundary after a SIGTERM, as a rank does whose
# node ends it before it can save (a cancel's KillWait running out on one node first).
TEST_DIE_ON_TERM_ENV = "SLURMTRAIN_TEST_DIE_ON_TERM"
# Codes the ranks agree on: 0 nothing, 1 stop (SIGTERM: save, no requeue), 2 stop and requeue.
NOTHING, STOP, REQUEUE = 0, 1, 2


class RequeueLimitReached(RuntimeError):
    pass


@dataclass(frozen=True)
class StopOutcome:
    exit_code: int
    requeue_job: str | None  # rank 0 runs `scontrol requeue` for it after cleaning up
    stopped: bool = False  # checkpointed and stopped before max_steps (exit 0 under SLURM's SIGTERM, no requeue)
    kind: str | None = None  # the end's event kind where it is not finished/stopped/preempted ("diverged")
    details: dict[str, Any] | None = None  # more fields for that event (a diverged run's good and abandoned steps)


class PreemptionWatcher:
    def __init__(self, env: DistEnv, device: torch.device, flag: StopFlag) -> None:
        self.env, self.device, self.flag = env, device, flag
        # The per-step agreement is a CPU all-reduce (gloo): on a GPU it would otherwise wait for the device at
        # every step, and nothing but a log step should.
        self.group = cpu_group()
        spec = os.environ.get(TEST_SIGNAL_ENV)
        fields = spec.split(":") if spec else []
        options = dict(f.partition("=")[::2] for f in fields[2:])
        in_group = options.get("group", os.environ.get(GROUP_ENV, "0")) == os.environ.get(GROUP_ENV, "0")
        self._test_trigger = (int(fields[0]), int(fields[1])) if fields and in_group else None
        self._test_target = os.getppid() if "parent" in options else os.getpid()
        self._test_signal = signal_number(options["signal"]) if options.get("signal") else flag.preempt
        self._test_die_on_term = os.environ.get(TEST_DIE_ON_TERM_ENV) == str(env.rank)
        self.agreed = NOTHING
        # What the stability verdicts call for (train/stability/monitor.py), agreed in the same all-reduce.
        self.trouble = 0

    def stop_requested(self, step: int, trouble: int = 0) -> bool:
        """Collective: every rank must call it at every step boundary. `trouble`: this rank's stability action,
        agreed (the largest) into self.trouble."""
        if self._test_trigger == (step, self.env.rank):
            os.kill(self._test_target, self._test_signal)
        if self._test_die_on_term and self.flag.received == signal.SIGTERM:
            os.kill(os.getpid(), signal.SIGKILL)
        local = REQUEUE if self.flag.wants_requeue else STOP if self.flag.received is not None else NOTHING
        self.agreed, self.trouble = all_reduce_max_each([local, trouble], self.group)  # one all-reduce for both
        return self.agreed != NOTHING


def all_reduce_max_each(values: list[int], group: Any) -> list[int]:
    """The largest of each value over the ranks, in one tiny CPU all-reduce."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return values
    t = torch.tensor(values, dtype=torch.int32)  # host memory: the group is gloo on every device
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return [int(v) for v in host_values(t)]


def slurm_job_id() -> str | None:
    if os.environ.get("SLURM_ARRAY_JOB_ID") and os.environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def preemption_requeues(job_id: str, run_dir: Path | None) -> int:
    """How often this job was requeued for a preemption: SLURM's restart count less the requeues that followed an
    unexpected failure (those count against cluster.max_failures instead)."""
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    if run_dir is None:
        return restarts
    from contract.rundir.events import is_failure, read_events

    failures = sum(1 for e in read_events(run_dir) if str(e.get("job")) == job_id and is_failure(e))
    return max(0, restarts - failures)


def after_stop(env: DistEnv, cfg: Any, step: int, agreed: int = REQUEUE, run_dir: Path | None = None) -> StopOutcome:
    """Called on every rank once the stop checkpoint is complete."""
    job_id = slurm_job_id()
    if env.launcher != "slurm" or job_id is None:
        if env.is_main:
            log.info("stopped at step %d with a complete checkpoint; run the same command to resume", step)
        return StopOutcome(EXIT_STOPPED, None, stopped=True)
    if agreed != REQUEUE:
        if env.is_main:
            log.info("got SIG%s: checkpointed at step %d; not requeueing (SLURM requeues a preempted job itself "
                     "when PreemptMode=REQUEUE; the same command resumes otherwise)", signal.Signals.SIGTERM.name[3:],
                     step)
        return StopOutcome(0, None, stopped=True)
    restarts = preemption_requeues(job_id, run_dir)
    # Jobs from sbatch/ scripts have no cluster section: the schema's default limit applies.
    limit = cfg.cluster.max_requeues if cfg.cluster is not None else ClusterConfig.max_requeues
    if restarts >= limit:
        raise RequeueLimitReached(
            f"checkpointed at step {step}, but job {job_id} was already requeued {restarts} times "
            f"(cluster.max_requeues={limit}): resubmit the same command to resume, or raise cluster.max_requeues"
        )
    if env.is_main:
        log.info("checkpointed at step %d; requeueing job %s (restart %d of at most %d)", step, job_id,
                 restarts + 1, limit)
    return StopOutcome(0, job_id if env.is_main else None)


def requeue(job_id: str) -> None:
    """The last thing rank 0 does: `scontrol requeue` ends this attempt (SIGTERM, then SIGKILL). Inside a container
    (no SLURM client there) the batch shell does it once the ranks have exited (contract/container/requeue.py)."""
    if ask_host(job_id):
        return
    out = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"scontrol requeue {job_id} failed: {out.stderr.strip()}")
