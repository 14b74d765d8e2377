"""Unexpected failures under SLURM: record how the attempt ended, then requeue the job within the failure budget.

A rank that raises (or whose watchdog fires) claims the attempt's recovery with an exclusive file, so that one
rank acts even though every rank fails soon after. Within `cluster.max_failures` it requeues the job, which starts
again from the newest complete checkpoint, leaving out the failed host when the partition has nodes to spare
(`ExcNodeList`, set by a detached helper once the job is pending again). Configuration errors (exit code 2)
never come here. RUN_DIR/events.jsonl gets one line per attempt's end (contract/rundir/events.py reads it).

A job that a user cancelled (`scancel` of the job, its array or the task) has not failed, even where its ranks fail
because the cancel ended a peer first: nothing is requeued, no node is left out, and the end is `cancelled`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from contract.container.requeue import ask_host
from contract.rundir import accounting, replicas
from contract.rundir import ckpt_layout as layout
from contract.rundir.environment import ENDING_DIR_ENV, EVENT_KIND, Ending
from contract.rundir.events import is_secondary_text, record_event, start_local_attempt, unexpected_failures
from train.faults.preemption import slurm_job_id
from train.observe.metrics import log

# A rank whose error is only that a peer went away waits this long for the rank that failed first to claim.
SECONDARY_WAIT_S = 10.0


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


# Outside SLURM: this attempt's number in the run, taken by rank 0 as it starts (begin_attempt).
_local_attempt = 0


def begin_attempt(run_dir: Path, is_main: bool) -> None:
    """Rank 0 of a run outside SLURM numbers its attempt from the run directory (SLURM numbers a job's attempts)."""
    global _local_attempt
    if is_main and slurm_job_id() is None:
        _local_attempt = start_local_attempt(run_dir)


def attempt() -> int:
    if slurm_job_id() is not None:
        return int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    return _local_attempt


def is_secondary(err: BaseException) -> bool:
    return is_secondary_text(f"{type(err).__name__}: {err}")


def _claim(run_dir: Path, job: str) -> bool:
    path = Path(run_dir) / f".recovery-{job}-{attempt()}"
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
    os.close(fd)
    return True


def heals_from_a_live_group(cfg: Any) -> bool:
    """A rank of a replica group (parallel.replica_groups > 1) while another group heartbeats to the lighthouse: its
    group heals from that one when it starts again, and loses no step to this failure."""
    if int((cfg.get("parallel") or {}).get("replica_groups", 1) or 1) <= 1:
        return False
    address = os.environ.get(replicas.LIGHTHOUSE_ENV)
    live = replicas.live_groups(address) if address else None
    return bool((live or set()) - {int(os.environ.get(replicas.GROUP_ENV, "0"))})


def _lost(cfg: Any, run_dir: Path, step: int, lost_steps: int | None) -> int:
    """The steps the recording rank's failure loses: the caller's count, else none for a replica group that heals
    from a live one (asked of the lighthouse only here, by the one rank that records), else those since the newest
    checkpoint."""
    if lost_steps is not None:
        return lost_steps
    return 0 if heals_from_a_live_group(cfg) else steps_lost(run_dir, step)


def steps_lost(run_dir: Path, step: int) -> int:
    latest = layout.latest_complete_checkpoint(run_dir)
    return max(0, step - (latest.step if latest is not None else 0))


def _scontrol(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=120, check=False)


def _excluded_now(job: str) -> list[str]:
    out = _scontrol("show", "job", job).stdout
    for word in out.split():
        if word.startswith("ExcNodeList=") and word != "ExcNodeList=(null)":
            expanded = _scontrol("show", "hostnames", word.split("=", 1)[1]).stdout.split()
            return expanded
    return []


def cancelled(job: str) -> bool:
    """Whether a user cancelled the job (`scancel` of the job, its array or the task) while its ranks still run. It
    reads COMPLETING in scontrol until they are gone, and the accounting has the cause. A step that srun ends
    because a rank failed leaves the job RUNNING, and a job we requeue reads REQUEUED."""
    try:
        out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30,
                             check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    state = next((w.split("=", 1)[1] for w in out.split() if w.startswith("JobState=")), None)
    if state != "COMPLETING":
        return state == "CANCELLED"
    rows = (accounting.attempts([job]) or {}).get(job) or []
    return bool(rows) and rows[-1].state == "CANCELLED"


def usable_nodes(partition: str | None) -> list[str]:
    args = ["sinfo", "-h", "-N", "-o", "%N %t"] + (["-p", partition] if partition else [])
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False).stdout
    bad = ("down", "drain", "fail", "maint", "unk", "inval")
    return sorted({n for n, state in (line.split()[:2] for line in out.splitlines() if line.strip())
                   if not any(state.startswith(b) for b in bad)})


def exclusion(cfg: Any, job: str, hosts: list[str]) -> list[str]:
    """The hosts to leave out of the requeued job: those left out before plus each of `hosts`, in order, while
    enough remain."""
    wanted = _excluded_now(job)
    if not hosts:
        return wanted
    usable = usable_nodes(cfg.cluster.partition)
    for host in dict.fromkeys(hosts):
        if host in wanted:
            continue
        remaining = [n for n in usable if n not in wanted and n != host]
        if len(remaining) < int(cfg.cluster.nodes):
            log.warning("not leaving out %s: the partition has no node to spare for %d node(s)", host,
                        cfg.cluster.nodes)
            continue
        wanted = sorted({*wanted, host})
    return wanted


def error_summary(err: BaseException, limit: int = 600) -> str:
    """The error for events.jsonl: its head and its tail when long. A collective's error (DCP's
    CheckpointException, say) carries every rank's traceback, and the cause is in its last lines."""
    text = f"{type(err).__name__}: {err}"
    if len(text) <= limit:
        return text
    head = limit // 3
    return f"{text[:head]} ... {text[-(limit - head - 5):]}"


def end_of_attempt(run_dir: Path, outcome: Any, step: int, started: float) -> str | None:
    """Rank 0, after an attempt that ended on its own terms: finished, stopped by a signal (a user's scancel:
    cancelled) or preempted. Returns the job to requeue, never one that a user cancelled meanwhile."""
    job = slurm_job_id()
    if job is not None and (Path(run_dir) / f".recovery-{job}-{attempt()}").exists():
        return None  # recover() recorded this attempt's end and requeued it (silent data corruption)
    kind = outcome.kind or ("preempted" if outcome.requeue_job else "stopped" if outcome.stopped else "finished")
    requeue_job = outcome.requeue_job
    if job is not None and kind != "finished" and cancelled(job):
        log.info("job %s was cancelled: checkpointed at step %d%s", job, step, "; not requeueing" if requeue_job else "")
        kind, requeue_job = "cancelled", None
    record_event(run_dir, kind, attempt=attempt(), job=job, host=node_name(), step=step,
                 steps_lost=0, started=started, ended=time.time(), **(outcome.details or {}))
    return requeue_job


def recover(cfg: Any, run_dir: Path, kind: str, step: int, host: str | None, err: BaseException | None = None,
            *, started: float, is_main: bool, culprits: list[str] | None = None, lost_steps: int | None = None,
            **details: Any) -> None:
    """Called by a failing rank. Under SLURM: record and requeue (one rank acts); `host` is the failed rank's
    host (left out when possible); for a hang, the host of the ranks that got least far, or None when no rank
    stands out; for silent data corruption, the first host outside the replicas' majority, and `culprits` every
    one of them (all left out when possible; default: `host`). Locally: rank 0 records. `lost_steps`: the steps
    lost when the caller knows better than the newest checkpoint (a replica group that heals loses none).
    `details`: more fields for the event."""
    job = slurm_job_id()
    if job is None or cfg.cluster is None:
        if is_main:
            record_event(run_dir, kind, attempt=attempt(), job=job, host=host or node_name(), step=step,
                         steps_lost=_lost(cfg, run_dir, step, lost_steps), started=started, ended=time.time())
        return
    if err is not None and is_secondary(err) and int((cfg.get("parallel") or {}).get("replica_groups", 1)) > 1:
        host = None  # a replica group goes whole and at once: its live rank 0 would hold the other groups' quorum
    elif err is not None and is_secondary(err):
        deadline = time.monotonic() + SECONDARY_WAIT_S
        while time.monotonic() < deadline:
            if (Path(run_dir) / f".recovery-{job}-{attempt()}").exists():
                return  # the rank that failed first handles it
            time.sleep(0.2)
        host = None  # nobody claimed: this rank only saw a peer vanish; don't blame its own host
    if not _claim(run_dir, job):
        return
    lost = _lost(cfg, run_dir, step, lost_steps)
    if cancelled(job):
        # The ranks failed because the cancel ended one of them first: nothing to requeue, no node to blame.
        log.warning("job %s was cancelled (%s at step %d): not requeueing", job, kind, step)
        record_event(run_dir, "cancelled", attempt=attempt(), job=job, host=node_name(), step=step, steps_lost=lost,
                     started=started, ended=time.time(), error=None if err is None else error_summary(err))
        return
    budget = int(cfg.cluster.max_failures)
    failed = unexpected_failures(run_dir) + 1
    record_event(run_dir, kind, attempt=attempt(), job=job, host=host if kind == "hung" else host or node_name(),
                 step=step, steps_lost=lost, started=started, ended=time.time(),
                 error=None if err is None else error_summary(err), **details)
    if failed > budget:
        log.error("failure %d of this run and cluster.max_failures=%d: not requeueing. Fix the cause (see the logs "
                  "and events.jsonl), then run the same command to resume from the last checkpoint", failed, budget)
        record_event(run_dir, "limit_reached", attempt=attempt(), job=job, step=step, steps_lost=0)
        return
    leave_out = exclusion(cfg, job, culprits if culprits is not None else [host] if host else [])
    log.error("%s at step %d (failure %d of at most %d): requeueing job %s from the newest complete checkpoint%s",
              kind, step, failed, budget, job, f" without {','.join(leave_out)}" if leave_out else "")
    if leave_out:
        exclude_when_pending(run_dir, job, leave_out)
    if ask_host(job):  # inside a container: the batch shell requeues once srun returns (contract/container/requeue.py)
        return
    out = _scontrol("requeue", job)
    if out.returncode != 0:
        log.error("scontrol requeue %s failed: %s", job, out.stderr.strip())


# SLURM changes a job's excluded nodes only while it is pending, and a requeue kills everything in the job, this
# process included, before the job is pending again. So a detached shell (its own session, deaf to the job's
# TERM and HUP) waits for the requeued job to be pending and sets ExcNodeList before its begin time comes. Where
# the cluster's process tracking reaps it anyway (cgroups), the job still restarts, only without the exclusion.
_EXCLUDE_SCRIPT = """trap '' TERM HUP
for _ in $(seq 600); do
  state=$(squeue -h -j "$1" -o %T 2>/dev/null)
  if [ "$state" = PENDING ]; then
    scontrol update JobId="$1" ExcNodeList="$2" && echo "left out $2 of job $1" && exit 0
  fi
  sleep 0.5
done
echo "job $1 never came back to pending: ExcNodeList not set" >&2
exit 1
"""


def exclude_when_pending(run_dir: Path, job: str, hosts: list[str]) -> None:
    log_path = Path(run_dir) / f"exclude-{job}-{attempt()}.log"
    with open(log_path, "ab") as out:
        subprocess.Popen(["setsid", "bash", "-c", _EXCLUDE_SCRIPT, "exclude", job, ",".join(hosts)],
                         stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, close_fds=True)


def end_for_environment(run_dir: Path, ending: Ending, err: BaseException, *, rank: int, step: int,
                        started: float) -> None:
    """A rank that died of its environment (contract/rundir/environment.py): the traceback goes to the rank's log
    only, the one line to the user, and an `environment` event to events.jsonl when the run directory still takes
    a write. Never requeued: the cause outlives a requeue. Locally the launcher prints the line and records the
    event (it also sees ranks that died without a word); under SLURM one rank records it and every rank prints the
    line on its stderr, which is the job's output."""
    _to_rank_log(logging.ERROR, "training failed", err)
    _to_rank_log(logging.ERROR, ending.line, None)
    fields = {"cause": ending.cause, "message": ending.line, "step": step, "started": started, "ended": time.time(),
              "host": node_name()}
    ending_dir = os.environ.get(ENDING_DIR_ENV)
    if ending_dir:
        try:
            (Path(ending_dir) / f"rank_{rank}.json").write_text(json.dumps(fields) + "\n")
            return
        except OSError:
            pass  # the launcher's directory went away too: say it here
    print(ending.line, file=sys.stderr, flush=True)
    job = slurm_job_id()
    if job is None:
        return
    try:
        if _claim(run_dir, job):  # also keeps the other ranks' recover() from requeueing this attempt
            record_event(run_dir, EVENT_KIND, attempt=attempt(), job=job, steps_lost=steps_lost(run_dir, step),
                         **fields)
    except OSError:
        pass  # the run directory takes no write: the line on stderr is all there is


def log_failure(err: BaseException) -> bool:
    """The traceback of a failed rank. One that only lost a peer keeps it to its log file, off the terminal (rank 0
    of a local run): the launcher names the rank that failed first, and a peer that died of its environment ends
    in one line there. True when it did so. A SystemExit has none: it was decided, and said, where it was raised
    (a replica group started to heal that found no live group, EXIT_NO_PEER)."""
    if isinstance(err, SystemExit):
        return False
    if is_secondary(err) and any(isinstance(h, logging.FileHandler) for h in log.handlers):
        _to_rank_log(logging.ERROR, "training failed: a peer went away", err)
        return True
    log.exception("training failed")
    return False


def _to_rank_log(level: int, message: str, err: BaseException | None) -> None:
    """To the rank's log file where it has one besides the terminal (rank 0 of a local run), else its stream (a
    local rank's log file, or the job's output under SLURM)."""
    files = [h for h in log.handlers if isinstance(h, logging.FileHandler)]
    exc_info = None if err is None else (type(err), err, err.__traceback__)
    record = log.makeRecord(log.name, level, __file__, 0, "%s", (message,), exc_info)
    for handler in files or log.handlers:
        handler.handle(record)
