"""What a run's GPU-time went to, from its ledger: the share that trained, and what went to start-up, failures
(restarts, the time between attempts, queue waits, redone steps, stalled steps), checkpointing and the rest. Pure
stdlib; launcher/observe/run_cost.py reads the run directory into lanes, launcher.status and bench/failure_cost.py
show the result.

A lane is a set of ranks that start and fail together: a plain run is one lane of all its ranks; a run with
parallel.replica_groups=N is N lanes (group k's run directory). Every figure is in rank-seconds (GPU-seconds on a
cluster): seconds of the lane's timeline times its ranks, summed over the lanes. A lane's timeline runs from its
first attempt's start to its last attempt's end and is cut into:

    trained      the steps that count, each once (the lane's newest step less the steps not applied and, for a
                 replica group, the steps trained without it), times the lane's median step time
    startup      its first attempt: from the process start to its first step (less one step's time)
    restart      the same for every later attempt: a restart's start-up, or a replica group's heal
    between      from an attempt's end to the next one's start: the relaunch (SLURM: the requeue and srun); a pause
                 the user chose (after a finished run later extended, a cancel, a local Ctrl-C) is left out, and
                 the start-up after it is start-up's
    queue        of that, the time the requeued job waited in SLURM's queue (sacct's Start - Submit); 0 locally
    redone       steps trained again: those after the newest checkpoint when an attempt failed and the next resumed
                 from it (a replica group that heals from a live peer redoes none)
    stalled      the time beyond the median of steps that took over STALL_FACTOR x it (survivors waiting out a lost
                 group, a straggler), first steps of attempts left out
    checkpoint   the training thread's time in saves (RUN_DIR/watchdog.json's `spent_s`, summed over the attempts)
    other        the rest of the attempts' time (logging, validation, slower steps, the last step's save)

Goodput = trained / total. The cost of failures = restart + between + queue + redone + stalled. A local run's time
between attempts is however long it took to run the command again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Any

PARTS = ("trained", "startup", "restart", "between", "queue", "redone", "stalled", "checkpoint", "other")
FAILURE_PARTS = ("restart", "between", "queue", "redone", "stalled")
STALL_FACTOR = 3.0
# RUN_DIR/watchdog.json (train/faults/watchdog.py): the learned timeouts and `spent_s`, seconds per section.
WATCHDOG_FILE = "watchdog.json"
LABELS = {"startup": "start-up", "restart": "restarts' start-up", "between": "between attempts",
          "queue": "queue waits", "redone": "redone steps", "stalled": "stalled steps", "checkpoint": "checkpointing",
          "other": "other"}


@dataclass
class Attempt:
    started: float
    ended: float
    step: int = 0  # the step it reached
    steps_lost: int = 0  # the steps after the newest checkpoint at its end (settled when the next one resumed)
    kind: str = ""
    local: bool = True  # not a SLURM job's: a "stopped" end was a user's Ctrl-C (under SLURM, often a preemption)

    @property
    def chosen(self) -> bool:
        """Ended by the user's choice (finished and later extended, cancelled, stopped with Ctrl-C): the pause before
        the next attempt and that attempt's start-up are no failure's cost."""
        return self.kind in ("finished", "cancelled") or (self.kind == "stopped" and self.local)


@dataclass
class Lane:
    ranks: int
    attempts: list[Attempt]  # oldest first
    rows: list[dict[str, Any]]  # metrics rows: step, time, step_time_s
    useful_steps: int  # steps that count for this lane
    checkpoint_s: float | None = None
    replica_group: bool = False  # restarts heal from a live group: no checkpoint, nothing redone
    queue_waits: list[float] = field(default_factory=list)  # each requeued attempt's wait in the queue (SLURM)


def attempts_of(ends: list[dict[str, Any]], starts: list[tuple[int, float]], rows: list[dict[str, Any]]
                ) -> list[Attempt]:
    """The attempts of one lane: every recorded end with its start and end time, and every local start
    (local_attempts.txt: number, time) that recorded none (killed with no word): it ends at its last logged row."""
    found = [Attempt(float(e["started"]), float(e["ended"]), int(e.get("step") or 0), int(e.get("steps_lost") or 0),
                     str(e.get("kind")), e.get("job") is None)
             for e in ends if e.get("started") is not None and e.get("ended") is not None]
    numbered = {e.get("attempt") for e in ends if e.get("job") is None and e.get("ended") is not None}
    times = sorted([a.started for a in found] + [t for _, t in starts])
    for number, start in starts:
        if number in numbered:
            continue
        later = [t for t in times if t > start]
        mine = [r for r in rows if start <= float(r.get("time", 0)) < (later[0] if later else float("inf"))]
        last = mine[-1] if mine else None
        found.append(Attempt(start, float(last["time"]) if last else start, int(last["step"]) if last else 0,
                             0, "no end recorded"))
    return sorted(found, key=lambda a: a.started)


def step_time(rows: list[dict[str, Any]]) -> float | None:
    """The median step time: of the rows' step_time_s, or with telemetry off, of the time between logged rows per
    step (the odd gap between attempts is far from the median)."""
    times = [float(r["step_time_s"]) for r in rows if r.get("step_time_s")]
    if not times:
        times = [(float(b["time"]) - float(a["time"])) / (int(b["step"]) - int(a["step"]))
                 for a, b in zip(rows, rows[1:], strict=False) if int(b["step"]) > int(a["step"])]
    return median(times) if times else None


def _redone(lane: Lane, i: int, first_next: dict[str, Any] | None) -> int:
    """Steps of attempt i trained again (or lost for good, after the last attempt)."""
    a = lane.attempts[i]
    if not lane.replica_group or first_next is None:
        return a.steps_lost
    # A replica group that healed starts past the step it reached: nothing of its own is trained again.
    return max(0, min(a.steps_lost, a.step - (int(first_next["step"]) - 1)))


def lane_cost(lane: Lane) -> dict[str, float]:
    """The lane's timeline in seconds (not yet times its ranks), one value per PARTS."""
    parts = dict.fromkeys(PARTS, 0.0)
    t = step_time(lane.rows)
    if not lane.attempts:
        return parts
    by_attempt = [[r for r in lane.rows if a.started <= float(r.get("time", 0)) <= a.ended] for a in lane.attempts]
    inside = sum(max(0.0, a.ended - a.started) for a in lane.attempts)
    resumed = 0
    for i, (a, rows) in enumerate(zip(lane.attempts, by_attempt, strict=True)):
        later = next((rs[0] for rs in by_attempt[i + 1:] if rs), None)
        redone = _redone(lane, i, later if i + 1 < len(lane.attempts) else None)
        parts["redone"] += redone * (t or 0.0)
        chosen = bool(i) and lane.attempts[i - 1].chosen  # a pause the user chose is left out of the timeline
        if i and not chosen:
            parts["between"] += max(0.0, a.started - lane.attempts[i - 1].ended)
        if rows:
            first = int(rows[0]["step"])
            start_step = max(resumed, first - 1) if lane.replica_group else resumed
            up = float(rows[0]["time"]) - a.started - max(1, first - start_step) * (t or 0.0)
            parts["stalled"] += _stalled(rows, t)
        else:  # nothing of it was kept (its rows were past the checkpoint the next one resumed from)
            up = a.ended - a.started - redone * (t or 0.0)
        parts["startup" if i == 0 or chosen else "restart"] += max(0.0, up)
        resumed = a.step - redone
    waits = sum(lane.queue_waits)
    parts["queue"] = min(parts["between"], waits)
    parts["between"] -= parts["queue"]
    parts["trained"] = max(0, lane.useful_steps) * (t or 0.0)
    parts["checkpoint"] = float(lane.checkpoint_s or 0.0)
    spent = sum(parts[k] for k in ("trained", "startup", "restart", "redone", "stalled", "checkpoint"))
    parts["other"] = max(0.0, inside - spent)
    return parts


def _stalled(rows: list[dict[str, Any]], t: float | None) -> float:
    """Time beyond the median of the logged intervals whose steps took over STALL_FACTOR x it; the attempt's
    first row (its first step) is start-up's."""
    if not t:
        return 0.0
    total = 0.0
    for before, row in zip(rows, rows[1:], strict=False):
        slow = float(row.get("step_time_s") or 0.0)
        if slow > STALL_FACTOR * t:
            total += (slow - t) * max(1, int(row["step"]) - int(before["step"]))
    return total


def run_cost(lanes: list[Lane]) -> dict[str, Any] | None:
    """The run's breakdown in rank-seconds: {"parts": {PART: rank-s}, "total", "goodput", "failures", "ranks"};
    None without a timed attempt."""
    if not any(lane.attempts for lane in lanes):
        return None
    parts = dict.fromkeys(PARTS, 0.0)
    for lane in lanes:
        for key, seconds in lane_cost(lane).items():
            parts[key] += seconds * lane.ranks
    total = sum(parts.values())
    return {"parts": parts, "total": total, "goodput": parts["trained"] / total if total > 0 else None,
            "failures": sum(parts[k] for k in FAILURE_PARTS), "ranks": sum(lane.ranks for lane in lanes),
            "lanes": len(lanes), "attempts": sum(len(lane.attempts) for lane in lanes)}


def cost_line(cost: dict[str, Any], accelerator: str = "GPU") -> str:
    """`GPU-time: 1,234 rank-s from the first start to the end: trained 80.1%, start-up 5.0%, ...; failures cost
    120 rank-s (9.7%)` for launcher.status; `CPU-time` where the ranks ran on CPUs (plan.json's accelerator)."""
    total, parts = cost["total"], cost["parts"]
    if total <= 0:
        return f"{accelerator}-time: nothing timed yet"
    shares = ", ".join(f"{LABELS.get(k, k)} {parts[k] / total:.1%}" for k in PARTS if k == "trained" or parts[k] > 0)
    return (f"{accelerator}-time: {total:,.0f} rank-s over {cost['attempts']} attempt(s) of {cost['lanes']} lane(s), "
            f"first start to end: {shares}; failures cost {cost['failures']:,.0f} rank-s "
            f"({cost['failures'] / total:.1%})")


def attempt_lines(lane: Lane) -> list[str]:
    """A plain run's failures, one line each: the attempt, its end, when it was seen, the steps redone, the
    time to the next attempt (of it in the queue) and that attempt's start-up."""
    from time import localtime, strftime

    lines = []
    t = step_time(lane.rows)
    waits = list(lane.queue_waits)
    for i, a in enumerate(lane.attempts[:-1]):
        if a.chosen:
            continue  # no failure: the user ended it and ran the command again
        b = lane.attempts[i + 1]
        rows = [r for r in lane.rows if b.started <= float(r.get("time", 0)) <= b.ended]
        up = f"; its first step {float(rows[0]['time']) - b.started:.1f} s after it started" if rows else ""
        queue = f" ({waits[i]:.0f} s in the queue)" if i < len(waits) else ""
        cost = f" ({a.steps_lost * t:.1f} s of steps)" if t and a.steps_lost else ""
        lines.append(f"attempt {i} {a.kind} at step {a.step} (seen {strftime('%H:%M:%S', localtime(a.ended))}): "
                     f"{a.steps_lost} step(s) since its checkpoint trained again{cost}; the next attempt started "
                     f"{max(0.0, b.started - a.ended):.1f} s later{queue}{up}")
    return lines
