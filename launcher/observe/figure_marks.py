"""What a run's figures mark besides its lines: where an attempt stopped and where the next resumed (from
RUN_DIR/events.jsonl), and the expert load of every MoE layer, each named (moe_load.png).

A stop is a dotted line at the step its attempt ended (gid "stop"); when the run went on, the resume is a dashed
line at the step the next attempt started from, its checkpoint's (the stop's step less its steps_lost; gid
"resume").
"""

from __future__ import annotations

from typing import Any

from contract.rundir.events import read_events
from contract.rundir.metrics_file import read_metrics, training_rows
from launcher.observe.runs import RunRef

# The ends of an attempt that a later attempt may resume from (a finished or pruned run has nothing after it).
STOPS = ("stopped", "preempted", "cancelled", "crashed", "hung", "killed", "limit_reached", "environment",
         "diverged")


def attempt_marks(run: RunRef) -> list[tuple[str, int]]:
    """(stop | resume, step) for each attempt of `run` that ended before the run did, in order."""
    last_step = max((int(r["step"]) for r in training_rows(read_metrics(run.run_dir)) if "step" in r), default=0)
    out: list[tuple[str, int]] = []
    for event in read_events(run.run_dir):
        step = event.get("step")
        if event.get("kind") not in STOPS or not isinstance(step, int):
            continue
        out.append(("stop", step))
        if last_step > step:  # the run went on: the next attempt resumed from its checkpoint
            out.append(("resume", step - int(event.get("steps_lost") or 0)))
    return out


def mark_attempts(ax: Any, runs: list[RunRef], label: bool = True) -> None:
    """The stops and resumes of every run as vertical lines in its colour, named once each: a stop on the bottom
    edge, a resume on the top one, and a resume at its stop's own step (nothing lost) in one label with it (two
    labels at one step overprinted each other)."""
    for i, run in enumerate(runs):
        marks = attempt_marks(run)
        for kind, step in marks:
            line = ax.axvline(step, color=f"C{i % 10}", alpha=0.6, linewidth=1,
                              linestyle=":" if kind == "stop" else "--")
            line.set_gid(kind)
            if not label or (kind == "resume" and ("stop", step) in marks):
                continue
            text = "stopped" if kind == "stop" else "resumed"
            if kind == "stop" and ("resume", step) in marks:
                text = "stopped and resumed"
            top = kind == "resume"
            ax.annotate(f"{text} {step}", xy=(step, 1.0 if top else 0.0), xycoords=ax.get_xaxis_transform(),
                        xytext=(2, -4 if top else 4), textcoords="offset points", rotation=90,
                        va="top" if top else "bottom", fontsize="x-small", color=f"C{i % 10}").set_gid(f"{kind}-label")


def moe_layer_lines(runs: list[RunRef]) -> list[tuple[str, list[int], list[float], str, str]]:
    """moe_load.png's lines: every MoE layer's expert load max/mean, one line per layer and run, named by layer:
    (label, steps, values, colour, line style) each, as figures.Series takes them."""
    out = []
    for i, run in enumerate(runs):
        rows = [r for r in training_rows(read_metrics(run.run_dir))
                if isinstance(r.get("moe_load_max_mean_by_layer"), dict)]
        layers = sorted({int(k) for r in rows for k in r["moe_load_max_mean_by_layer"]})
        for j, layer in enumerate(layers):
            points = [(r["step"], float(r["moe_load_max_mean_by_layer"][str(layer)])) for r in rows
                      if str(layer) in r["moe_load_max_mean_by_layer"]]
            name = f"layer {layer}" if len(runs) == 1 else f"{run.name} layer {layer}"
            color = f"C{j % 10}" if len(runs) == 1 else f"C{i % 10}"
            style = "-" if len(runs) == 1 else ["-", "--", ":", "-."][j % 4]
            out.append((name, [s for s, _ in points], [v for _, v in points], color, style))
    return out
