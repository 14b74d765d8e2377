"""What one failure costs, both ways (issue 47, acceptance 2): the same SIGKILL of data-parallel rank 2 at step K, in
a run of 3 replica groups x 1 rank (parallel.replica_groups=3: the lost group heals from a live one while the others
train on) and in a plain run of the same data-parallel size (local.nproc=3: the kill ends the attempt, and the same
command run again resumes from the last checkpoint, as SLURM's requeue would), the tiny model on CPU, ddp.

Nothing here times the failure itself: both runs' costs are read from their ledgers by the code launcher.status uses
(launcher/observe/run_cost.py, contract/rundir/failure_cost.py): each run's GPU-time in rank-seconds from the first
start to the end, cut into trained steps, start-up, and what the failure cost (restarts' start-up or the heal, the
time between attempts, queue waits, redone steps, stalled steps), checkpointing and the rest. The figure is the plain
run's failure cost over the replica groups'.

Queue waits are 0 here: nothing waits in a queue locally. On a cluster, the plain run's whole job is requeued and
every rank waits (3 x the wait), while only the lost group's task would (1 x the wait): what a measured wait would add
is in the result (`queue_per_s`), and the local cluster's accounting's requeue waits are quoted (sacct's Start -
Submit of requeued attempts, accounting.queue_waits) where it has some.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contract.rundir import replicas
from contract.rundir.failure_cost import FAILURE_PARTS, LABELS, PARTS
from contract.rundir.metrics_file import read_metrics
from launcher.observe.run_cost import cost, cost_notes
from launcher.observe.runs import read_config

RANKS = 3
SIZES = {False: {"steps": 600, "kill_at": 50, "ckpt_every": 40}, True: {"steps": 300, "kill_at": 30, "ckpt_every": 20}}
COMMON = ["strategy=ddp", f"local.nproc={RANKS}", "trainer.log_every=1", "trainer.cpu_threads=1", "logger.backend=none"]
# The lighthouse drops a lost group within 1.5 s (the survivors' pause), as tests/dist/test_replica_groups.py does.
GROUPS = [f"parallel.replica_groups={RANKS}", "parallel.replica_heartbeat_timeout_ms=1500",
          "parallel.replica_join_timeout_ms=5000", "parallel.replica_timeout_s=10",
          "parallel.replica_quorum_timeout_s=30"]
PID = re.compile(r"joined via \w+: .* pid (\d+)")
TIMEOUT_S = 900


class BenchError(RuntimeError):
    pass


def _poll(check: Callable[[], Any], what: str, proc: subprocess.Popen[bytes], timeout: float = TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if proc.poll() is not None:
            raise BenchError(f"the launcher ended ({proc.returncode}) before {what}: {_tail(proc)}")
        time.sleep(0.05)
    raise BenchError(f"timed out waiting for {what}")


def _tail(proc: subprocess.Popen[bytes], chars: int = 2000) -> str:
    """The end of what the launcher wrote to its stderr file (chars=0: all of it)."""
    path: Path = getattr(proc, "err_path")  # noqa: B009 - set by _launch
    return path.read_text(errors="replace")[-chars:]


def _rows(run_dir: Path) -> int:
    return len(read_metrics(run_dir)) if (run_dir / "metrics.jsonl").is_file() else 0


def _pid(log: Path) -> int | None:
    found = PID.search(log.read_text(errors="replace")) if log.is_file() else None
    return int(found.group(1)) if found else None


def _kill_at(proc: subprocess.Popen[bytes], steps_of: Path, victim_log: Path, step: int) -> int:
    """SIGKILL the rank whose log is `victim_log` once `steps_of` logged `step` steps; the step it had reached."""
    _poll(lambda: _rows(steps_of) >= step, f"step {step}", proc)
    pid = _poll(lambda: _pid(victim_log), f"the pid in {victim_log}", proc)
    os.kill(pid, signal.SIGKILL)
    return _rows(steps_of)


def _launch(args: list[str], root: Path, name: str) -> subprocess.Popen[bytes]:
    """The launcher with its output in ROOT/NAME.out and .err (group 0's rank 0 writes every step's line to it: a
    pipe nobody reads would fill and stop it)."""
    with open(root / f"{name}.out", "ab") as out, open(root / f"{name}.err", "ab") as err:
        proc = subprocess.Popen([sys.executable, "-m", "launcher", *args], cwd=root, stdout=out, stderr=err)
    proc.err_path = root / f"{name}.err"  # type: ignore[attr-defined]
    return proc


def _finish(proc: subprocess.Popen[bytes]) -> str:
    try:
        proc.wait(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return _tail(proc, 0)


def replica_run(root: Path, size: dict[str, int]) -> dict[str, Any]:
    args = [*COMMON, *GROUPS, f"trainer.max_steps={size['steps']}", f"trainer.ckpt_every={size['ckpt_every']}",
            f"run.root={root}", "run.name=groups"]
    run_dir, proc = root / "groups", _launch(args, root, "groups")
    lost = replicas.group_dir(run_dir, 2)
    try:
        killed = _kill_at(proc, lost, lost / "logs" / "rank_0.log", size["kill_at"])
    finally:
        err = _finish(proc)
    if proc.returncode != 0 or "replica group 2 lost" not in err:
        raise BenchError(f"replica groups: exit {proc.returncode}: {err[-2000:]}")
    ledger = replicas.failure_lines(_events(run_dir), RANKS, size["steps"])
    return {"killed_at": killed, **_costs(run_dir), "ledger": ledger, "rejoined": _rejoined(run_dir)}


def plain_run(root: Path, size: dict[str, int]) -> dict[str, Any]:
    args = [*COMMON, f"trainer.max_steps={size['steps']}", f"trainer.ckpt_every={size['ckpt_every']}",
            f"run.root={root}", "run.name=plain"]
    run_dir, proc = root / "plain", _launch(args, root, "plain")
    try:
        killed = _kill_at(proc, run_dir, run_dir / "logs" / f"rank_{RANKS - 1}.log", size["kill_at"])
    finally:
        err = _finish(proc)
    if proc.returncode == 0:
        raise BenchError(f"plain run: the SIGKILL did not end the attempt: {err[-2000:]}")
    again = _launch(args, root, "plain")  # the same command: it resumes from the last checkpoint
    err = _finish(again)
    if again.returncode != 0 or "resumed from" not in (run_dir / "logs" / "rank_0.log").read_text(errors="replace"):
        raise BenchError(f"plain run: the second attempt: exit {again.returncode}: {err[-2000:]}")
    return {"killed_at": killed, **_costs(run_dir)}


def _costs(run_dir: Path) -> dict[str, Any]:
    """The breakdown and the lines launcher.status prints under its table for this run."""
    config = read_config(run_dir)
    breakdown = cost(run_dir, config)
    return {"cost": breakdown, "lines": cost_notes(run_dir, config, breakdown)}


def _events(run_dir: Path) -> list[dict[str, Any]]:
    from contract.rundir.events import read_events

    return read_events(run_dir)


def _rejoined(run_dir: Path) -> bool:
    return any(e.get("rejoined_step") is not None for e in replicas.failures(_events(run_dir)))


def cluster_queue_waits() -> list[float]:
    """The requeued attempts' waits in the local cluster's accounting (sacct over the last day), if it has any."""
    try:
        out = subprocess.run(["sacct", "-a", "-D", "-X", "-n", "-P", "-S", "now-1days", "-o", "JobID,Submit,Start"],
                             capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    from contract.rundir.accounting import parse_queue_times

    return [w for waits in parse_queue_times(out.stdout).values() for w in waits[1:]] if out.returncode == 0 else []


def run(quick: bool = False) -> dict[str, Any]:
    try:
        import torchft  # noqa: F401
    except ImportError:
        return {"skipped": "torchft is not installed (pip install -e .[ft])", "target_met": True}
    size = SIZES[quick]
    with tempfile.TemporaryDirectory(prefix="bench_failure_cost_") as tmp:
        groups = replica_run(Path(tmp), size)
        plain = plain_run(Path(tmp), size)
    if groups["cost"] is None or plain["cost"] is None:
        raise BenchError("a run left no timed attempt in its ledger")
    ratio = plain["cost"]["failures"] / groups["cost"]["failures"] if groups["cost"]["failures"] > 0 else None
    waits = cluster_queue_waits()
    return {
        "quick": quick, **size, "ranks": RANKS,
        "replica_groups": groups, "plain": plain,
        "failure_cost_ratio": ratio,
        # On a cluster a requeue's queue wait adds this many rank-seconds per second waited.
        "queue_per_s": {"plain": RANKS, "replica_groups": 1},
        "cluster_requeue_waits_s": sorted(waits),
        "target_met": ratio is not None and ratio >= 1.0,
        "command": "python -m bench failure_cost" + (" --quick" if quick else ""),
    }


def _parts(c: dict[str, Any]) -> str:
    return ", ".join(f"{LABELS[k]} {c['parts'][k]:.1f}" for k in FAILURE_PARTS if c["parts"][k] > 0) or "none"


def figures(r: dict[str, Any]) -> list[dict[str, Any]]:
    g, p = r["replica_groups"]["cost"], r["plain"]["cost"]
    rows = [{"figure": "lost GPU-time to one failure: plain restart / replica groups", "value": r["failure_cost_ratio"],
             "baseline": f"replica groups ({RANKS} x 1 rank) healing the same failure", "target": ">= 1x",
             "met": r["target_met"],
             "detail": f"plain {p['failures']:.1f} rank-s ({_parts(p)}); groups {g['failures']:.1f} rank-s "
                       f"({_parts(g)}); queue waits 0 locally"}]
    for name, c in (("replica groups", g), ("plain restart", p)):
        rows.append({"figure": f"goodput, {name}", "value": c["goodput"],
                     "baseline": "share of the rank-seconds from the first start to the end that trained",
                     "target": None, "met": None, "detail": f"{c['total']:.0f} rank-s over {c['attempts']} attempts"})
    return rows


def report(r: dict[str, Any]) -> str:
    if "skipped" in r:
        return f"failure cost: skipped ({r['skipped']})"
    g, p = r["replica_groups"]["cost"], r["plain"]["cost"]
    ratio = "-" if r["failure_cost_ratio"] is None else f"{r['failure_cost_ratio']:.2f}x"
    waits = r["cluster_requeue_waits_s"]
    quoted = (f"; this cluster's accounting has {len(waits)} requeued attempt(s) that waited a median "
              f"{waits[len(waits) // 2]:.0f} s (the tests release theirs at once; SLURM itself holds a requeued job "
              "about 2 minutes)" if waits else "")
    return (f"failure cost ({RANKS} ranks, tiny, SIGKILL of rank 2 at step {r['kill_at']} of {r['steps']}, "
            f"checkpoint every {r['ckpt_every']}): plain restart {p['failures']:.1f} rank-s ({_parts(p)}) = {ratio} "
            f"the replica groups' {g['failures']:.1f} rank-s ({_parts(g)}); goodput {p['goodput']:.1%} against "
            f"{g['goodput']:.1%}; group 2 {'rejoined' if r['replica_groups']['rejoined'] else 'never rejoined'}. "
            f"Queue waits are 0 locally; on a cluster each second a requeue waits adds {RANKS} rank-s to the plain "
            f"run and 1 to the replica groups (the lost group's task alone){quoted}")


def notes(r: dict[str, Any]) -> str:
    if "skipped" in r:
        return ""
    lines = [f"`{r['command']}`: the same SIGKILL of data-parallel rank 2 at step {r['kill_at']} of {r['steps']}, "
             "read from each run's ledger (launcher/observe/run_cost.py), in rank-seconds:", "",
             "| part | replica groups | plain restart |", "| --- | --- | --- |"]
    g, p = r["replica_groups"]["cost"], r["plain"]["cost"]
    for k in PARTS:
        lines.append(f"| {LABELS.get(k, k)} | {g['parts'][k]:.1f} | {p['parts'][k]:.1f} |")
    lines += [f"| **failures** | {g['failures']:.1f} | {p['failures']:.1f} |", "", "launcher.status's lines:", "",
              *(f"- groups: {line}" for line in [*r["replica_groups"]["ledger"], *r["replica_groups"]["lines"]]),
              *(f"- plain: {line}" for line in r["plain"]["lines"])]
    return "\n".join(lines)
