"""RUN_DIR/events.jsonl: one line per attempt's end, and the figures derived from it. Pure stdlib (login side).

    {"time": epoch, "kind": "finished" | "preempted" | "stopped" | "cancelled" | "crashed" | "hung" | "limit_reached"
     | "environment" | "killed" | "pruned", "attempt": N, "job": id, "host": name, "step": N, "steps_lost": K, ...}

A `pruned` end is a search's trial that its pruner stopped (train/search/): `trial`, `metric` and `value` say where.
An `environment` end (contract/rundir/environment.py: a full disk, a vanished or read-only run directory, host memory
exhausted) carries its cause and the one line the user saw (`message`). A `killed` end is a local run stopped at
once, without a checkpoint (a second Ctrl-C): the local launcher records it, as it records the end of an attempt
whose rank 0 died without recording one (launcher/run/local_ends.py); `step` is then the newest step logged.

Lines of the stability kinds (train/stability) come between the ends: "skipped_step" (a step not applied: its
reason, nonfinite, spike or loss_scale (an fp16 overflow the loss scaler skipped, routine), and its samples),
"rollback" (from step, to the checkpoint's step, the sample ranges skipped from then on); a run that stability
stopped ends "diverged". "corruption" (train/stability/replicas.py): replicas that should hold
identical weights disagreed at `step`; `ranks` outside the majority (or `suspects`, with no majority) and their
`hosts`; under SLURM, where it named hosts, it also ends the attempt that was requeued without them (that line has
`ended`, and only that one is a failure: one rolled back in process is not).

`attempt` counts a job's attempts as SLURM does (SLURM_RESTART_COUNT); a local run's attempts are counted over
the run directory (start_local_attempt), so that a run stopped, crashed or killed and run again gets 0, 1, 2, ...

Goodput is the share of the attempts' wall time spent on steps that counted: the steps of the run (each once)
times their median duration, over the summed duration of every attempt.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from statistics import median
from typing import Any

EVENTS_FILE = "events.jsonl"
# One line per local attempt, written as it starts: "N START_TIME HOST PID".
LOCAL_ATTEMPTS_FILE = "local_attempts.txt"
UNEXPECTED = ("crashed", "hung", "corruption")
# Lines that are not the end of an attempt (a "corruption" is one under SLURM when its job was requeued for it).
WITHIN_ATTEMPT = ("skipped_step", "rollback", "corruption", "replica_lost", "replica_rejoined",
                  "replica_sync_discarded", "replica_left", "replica_restarting")


def record_event(run_dir: Path, kind: str, **fields: Any) -> None:
    from contract.rundir import env_faults  # pure stdlib, tests only

    path = Path(run_dir) / EVENTS_FILE
    line = json.dumps({"time": time.time(), "kind": kind, **fields}) + "\n"
    env_faults.disk_full("events", fields.get("step"), path)
    with open(path, "a+b") as f:  # one short append per line: atomic on local and NFS
        # A line cut short (a full disk, a killed writer) must not swallow this one: it starts on a line of its own.
        f.seek(0, os.SEEK_END)
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                line = "\n" + line
        f.write(line.encode())


def record_environment_end(run_dir: Path, attempt: int, **fields: Any) -> None:
    """The local launcher's record of an attempt that died of its environment: it takes the place of the end a
    surviving rank recorded for the same attempt (crashed, having lost its peer), so an attempt has one end."""
    from contract.rundir.environment import EVENT_KIND

    events = read_events(run_dir)
    same = [i for i, e in enumerate(events) if e.get("job") is None and e.get("attempt") == attempt]
    if any(events[i].get("kind") == EVENT_KIND for i in same):
        return
    if not same:
        record_event(run_dir, EVENT_KIND, attempt=attempt, job=None, **fields)
        return
    events[same[-1]] = {**events[same[-1]], "time": time.time(), "kind": EVENT_KIND, **fields}
    _rewrite(run_dir, events)


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / EVENTS_FILE
    if not path.is_file():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a crash
    return events


def start_local_attempt(run_dir: Path, pid: int | None = None, start_time: float | None = None) -> int:
    """Number a local attempt of the run as it starts and note it: one past every earlier local attempt, those that
    recorded their end and those that died without a word (each start is a line of RUN_DIR/local_attempts.txt;
    ends recorded before that file existed count too). `pid`, `start_time`: its rank 0 and start, when another process
    numbers it afterwards (the local launcher, for a rank 0 that died first); this process and now by default."""
    ledger = Path(run_dir) / LOCAL_ATTEMPTS_FILE
    started = []
    if ledger.is_file():
        for line in ledger.read_text().splitlines():
            head = line.split(maxsplit=1)[:1]
            if head and head[0].isdigit():
                started.append(int(head[0]))
    ended = [e for e in read_events(run_dir) if e.get("job") is None and e.get("kind") not in WITHIN_ATTEMPT]
    number = max(1 + max(started, default=-1), len(ended),
                 1 + max((int(e.get("attempt") or 0) for e in ended), default=-1))
    with open(ledger, "a") as f:
        f.write(f"{number} {time.time() if start_time is None else start_time:.3f} {socket.gethostname()} "
                f"{os.getpid() if pid is None else pid}\n")
    return number


def _local_starts(run_dir: Path) -> list[tuple[int, float, list[str]]]:
    """RUN_DIR/local_attempts.txt, oldest first: each attempt's number, start time and the rest of its line (host,
    pid); a line cut short is left out."""
    try:
        lines = (Path(run_dir) / LOCAL_ATTEMPTS_FILE).read_text().splitlines()
    except OSError:
        return []
    starts = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[0].isdigit():
            try:
                starts.append((int(parts[0]), float(parts[1]), parts[2:]))
            except ValueError:
                continue
    return starts


def last_local_attempt(run_dir: Path) -> tuple[int, float] | None:
    """The number and start time of the newest local attempt (RUN_DIR/local_attempts.txt), None when none started."""
    starts = _local_starts(run_dir)
    return starts[-1][:2] if starts else None


def newest_local_process(run_dir: Path) -> tuple[str, int] | None:
    """The host and rank-0 pid of the newest local attempt (RUN_DIR/local_attempts.txt), None when none is noted."""
    starts = _local_starts(run_dir)
    rest = starts[-1][2] if starts else []
    return (rest[0], int(rest[1])) if len(rest) >= 2 and rest[1].isdigit() else None


def local_attempt_of(run_dir: Path, pid: int) -> tuple[int, float] | None:
    """The number and start time of the local attempt that process `pid` of this host (its rank 0) numbered; None
    when it numbered none (it died first)."""
    mine = [socket.gethostname(), str(pid)]
    return next(((number, start) for number, start, rest in reversed(_local_starts(run_dir)) if rest[:2] == mine),
                None)


def local_attempt_end(run_dir: Path, attempt: int) -> dict[str, Any] | None:
    """The recorded end of local attempt `attempt`, None before one."""
    ends = [e for e in read_events(run_dir)
            if e.get("job") is None and e.get("attempt") == attempt and e.get("kind") not in WITHIN_ATTEMPT]
    return ends[-1] if ends else None


def settle_steps_lost(run_dir: Path, resumed_step: int) -> None:
    """A resume knows what the last attempt really lost: its end's step less the step resumed from. (At a crash an
    asynchronous save may still complete after the end was recorded, so the recorded count can be too high.)"""
    events = read_events(run_dir)
    ends = [e for e in events if e.get("kind") not in WITHIN_ATTEMPT]
    if not ends or ends[-1].get("step") is None:
        return
    last = ends[-1]
    if last.get("kind") not in ("crashed", "hung", "preempted", "stopped", "cancelled", "environment", "killed"):
        return
    lost = max(0, int(last["step"]) - int(resumed_step))
    if last.get("steps_lost") == lost:
        return
    last["steps_lost"] = lost
    _rewrite(run_dir, events)


def _rewrite(run_dir: Path, events: list[dict[str, Any]]) -> None:
    path = Path(run_dir) / EVENTS_FILE
    tmp = path.with_name(f".{EVENTS_FILE}.tmp")
    tmp.write_text("".join(json.dumps(e) + "\n" for e in events))
    tmp.replace(path)


def is_failure(event: dict[str, Any]) -> bool:
    """An attempt that ended unexpectedly (cluster.max_failures counts them): a crash, a hang, or silent data
    corruption that ended its attempt (requeued without the bad hosts); not one the run rolled back in process."""
    kind = event.get("kind")
    return kind in UNEXPECTED and (kind != "corruption" or event.get("ended") is not None)


def unexpected_failures(run_dir: Path) -> int:
    return sum(1 for e in read_events(run_dir) if is_failure(e))


def counts(events: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in events:
        out[e["kind"]] = out.get(e["kind"], 0) + 1
    return out


def goodput(events: list[dict[str, Any]], metrics: list[dict[str, Any]], kept_step: int | None = None) -> float | None:
    """Useful step time over the attempts' total time, in [0, 1]; None without timed attempts or step times. The
    useful steps are those up to `kept_step` (the newest logged step when not given; the checkpoint's step when the
    work after it was discarded, kept_step): steps replayed after a rollback count once, and steps not applied
    (skipped) don't count."""
    spent = sum(float(e["ended"]) - float(e["started"]) for e in events
                if e.get("started") is not None and e.get("ended") is not None)
    times = [float(m["step_time_s"]) for m in metrics if m.get("step_time_s")]
    if spent <= 0 or not times:
        return None
    kept = max((int(m["step"]) for m in metrics), default=0) if kept_step is None else kept_step
    steps = kept - sum(1 for s in skipped_steps(events) if s <= kept)
    return max(0.0, min(1.0, steps * median(times) / spent))


def last_end(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest attempt's end, None before any."""
    ends = [e for e in events if e.get("kind") not in WITHIN_ATTEMPT]
    return ends[-1] if ends else None


# Ends whose work after the newest checkpoint is gone (a resume starts from that checkpoint again).
LOSING_ENDS = ("diverged", "crashed", "hung", "environment", "limit_reached", "killed")


def kept_step(events: list[dict[str, Any]], metrics: list[dict[str, Any]], checkpoint_step: int | None,
              final: dict[str, Any] | None) -> int:
    """The run's progress that counts: up to the newest checkpoint after an end that lost the work after it (`final`:
    the end no attempt followed), else the newest step logged or checkpointed."""
    if final is not None and final.get("kind") in LOSING_ENDS:
        return checkpoint_step or 0
    return max([int(m["step"]) for m in metrics if m.get("step") is not None] + [checkpoint_step or 0])


def ending_state(events: list[dict[str, Any]], final: dict[str, Any] | None) -> str | None:
    """The state a run left by `final` is in: diverged (stability stopped it), or crashed, hung or killed and not
    run again (after limit_reached: the failure before it); None for the other ends."""
    if final is None:
        return None
    kind = final.get("kind")
    if kind == "limit_reached":
        before = [e for e in events if e.get("kind") in ("crashed", "hung") and e is not final]
        kind = before[-1].get("kind") if before else "crashed"
    return kind if kind in ("diverged", "crashed", "hung", "killed") else None


def skipped_steps(events: list[dict[str, Any]]) -> list[int]:
    """The steps not applied that are still part of the run: those a later rollback went back before are
    replayed (and so are not lost twice)."""
    kept: list[int] = []
    for e in events:
        if e.get("kind") == "skipped_step" and e.get("step") is not None:
            kept.append(int(e["step"]))
        elif e.get("kind") == "rollback" and e.get("to_step") is not None:
            kept = [s for s in kept if s <= int(e["to_step"])]
    return kept


def corruption_notes(events: list[dict[str, Any]]) -> list[str]:
    """One line per silent data corruption found: the step, the disagreeing ranks and their hosts."""
    notes = []
    for e in events:
        if e.get("kind") != "corruption":
            continue
        ranks = e.get("ranks") or e.get("suspects") or []
        who = ", ".join(f"rank {r} ({h})" for r, h in zip(ranks, e.get("hosts") or [], strict=False))
        verdict = "outside the replicas' majority" if e.get("ranks") else "disagreeing, no majority"
        notes.append(f"silent data corruption at step {e.get('step')}: {who} {verdict}")
    return notes


def stability_notes(events: list[dict[str, Any]]) -> list[str]:
    """One line per rollback (where from and to, why, the sample ranges skipped from then on), the count of
    steps not applied (train/stability), and, where the run's last end is a divergence, its last good checkpoint and
    the later ones: an abandoned branch that the same command would resume."""
    notes = []
    for i, e in enumerate(events):
        if e.get("kind") == "rollback":
            ranges = ", ".join(f"[{a}, {b})" for a, b in e.get("skipped") or []) or "none"
            notes.append(f"rolled back from step {e.get('step')} to step {e.get('to_step')} ({e.get('reason')}): "
                         f"samples {ranges} skipped")
        abandoned = e.get("abandoned") if e.get("kind") == "diverged" else None
        if abandoned and all(x.get("kind") in WITHIN_ATTEMPT for x in events[i + 1:]):
            good, many = e.get("good_step"), len(abandoned) > 1
            notes.append(f"diverged at step {e.get('step')}: "
                         + (f"the last good checkpoint is step {good}" if good is not None else "no checkpoint is good")
                         + f"; step{'s' * many} {', '.join(map(str, abandoned))} {'are' if many else 'is'} from the "
                         f"abandoned branch (the newest is what the same command would resume): go on as the stop line "
                         f"said (the end of logs/rank_0.log)")
    skipped = [e for e in events if e.get("kind") == "skipped_step"]
    if skipped:
        spikes = sum(1 for e in skipped if e.get("reason") == "spike")
        scaler = sum(1 for e in skipped if e.get("reason") == "loss_scale")  # fp16 overflows: routine
        overflows = f", {scaler} fp16 overflows the loss scaler skipped" if scaler else ""
        notes.append(f"{len(skipped)} step(s) not applied ({len(skipped) - spikes - scaler} non-finite, {spikes} "
                     f"spikes{overflows}), the last at step {skipped[-1].get('step')}")
    return notes


# Errors a rank raises because a peer vanished (its process died, its node went away): not the failure itself.
SECONDARY_ERRORS = ("Connection closed by peer", "Connection reset by peer", "DistBackendError", "Broken pipe",
                    "NCCL communicator was aborted", "Socket Timeout")


def is_secondary_text(text: str) -> bool:
    return any(marker in text for marker in SECONDARY_ERRORS)
