"""The way on after stability stopped a run: what the losses say went wrong, and a command that fits it and works as
written (pure stdlib).

    one bad batch      a single non-finite step after healthy ones (stability.nonfinite=stop): the same run resumed
                       with stability.nonfinite=skip, which doesn't apply that step and reads on past its samples
    blew up            the loss far above the run's start (contract/rules/blowup.py): a rate lower by a power of
                       ten (at least 10x), from the last checkpoint not far above the best, else from the weights
                       the run started from
    collapsed, dead   the loss sat at a random model's after the run had been below it, or training went non-finite
                       at once from the checkpoint a rollback went to: no checkpoint of it is good, 10x lower
    at once            non-finite from the first step: from its model.init_from, those weights are broken (start from
                       random weights); from random weights, the rate is far too high (10x lower)
    climbed, recurring the loss far above the best it reached, or non-finite steps that kept coming back: half the rate
                       from a good checkpoint; starting over (no good checkpoint) is always at least 10x lower

The resume checks refuse a changed optim.lr on the same run (launcher/checks/resume_checks.py), so "lower the rate and
run the same command" cannot work. With a good checkpoint the way on is a new run from its weights
(model.init_from: the optimizer, the schedule and the data position start fresh); with none, the same run over
(run.overwrite=true), from the weights it started from. The command is the run's own (RUN_DIR/command.txt, its last
launch) with those keys replaced.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from contract.rules.blowup import LossHistory, ceiling, collapsed, far_above, lr_cut, reference
from contract.rundir import ckpt_layout as layout

# Keys the advice sets: the run's own values of them are dropped from its command (a key twice is refused).
REPLACED = ("optim.lr", "run.name", "model.init_from", "run.overwrite", "run.resume")
RESUME_REPLACED = ("stability.nonfinite", "run.name", "run.overwrite", "run.resume")
# The suffix the advice gives a run it renames for its rate (div2-lr5000): it follows the rate of the next advice.
RATE_SUFFIX = re.compile(r"-lr\d+(?:\.\d*)?(?:e[+-]?\d+)?$")
# The least cut when starting over: a run with no good checkpoint at all needs a real change, not another half.
START_OVER_CUT = 10


@dataclass(frozen=True)
class Cause:
    """What the losses say went wrong: `kind` one_batch, blew_up, climbed or recurring; the rate divided by `cut`
    fits it; `said`: the evidence in words; `init_blown`: the weights the run started from are broken (far above a
    random model's loss, or training failed at once from its model.init_from), `init_note` says how."""
    kind: str
    cut: int
    said: str = ""
    init_blown: bool = False
    init_note: str = "far above a random model's loss"


def diagnose(history: LossHistory, vocab_size: int | None, margin: float, *, one_step: bool,
             dead: list[int] | tuple[int, ...] = (), at_once: bool = False, init_from: str | None = None) -> Cause:
    """The cause from the run's losses (start, best, the last finite one before the trouble); `one_step`: the trouble
    is a single non-finite step under stability.nonfinite=stop; `dead`: checkpoints training went non-finite from at
    once after a rollback; `at_once`: the trouble began at the run's first step; `init_from`: its model.init_from."""
    start_ref, best_ref = reference(history.start, vocab_size), reference(history.best, vocab_size)
    init_blown = far_above(history.start, ceiling(vocab_size), margin)
    if at_once and init_from:
        return Cause("at_once", START_OVER_CUT, f"training went non-finite at its first step from the weights it "
                     f"started from (model.init_from={init_from}): those weights are broken", True,
                     "went non-finite at once")
    if at_once and not one_step:
        return Cause("at_once", START_OVER_CUT, "training went non-finite at its first step: the rate is far too high")
    if history.last is None:
        return Cause("one_batch", 1) if one_step else Cause("recurring", 2, "", init_blown)
    last = f"{history.last:.4g} at step {history.last_step}"
    if far_above(history.last, start_ref, margin):
        assert start_ref is not None
        start = (f"a random model's loss, ln({vocab_size}) = {start_ref:.4g}" if init_blown or history.start is None
                 else f"its start, {history.start:.4g} at step {history.start_step}")
        return Cause("blew_up", lr_cut(history.last, start_ref),
                     f"the loss blew up far above {start} (to {last}; stability.blowup_margin={margin:g})",
                     init_blown)
    if far_above(history.last, best_ref, margin):
        return Cause("climbed", 2, f"the loss climbed far above the best it reached ({last} against "
                     f"{history.best:.4g} at step {history.best_step}; stability.blowup_margin={margin:g})")
    if collapsed(history.last, history.best, vocab_size):
        return Cause("collapsed", START_OVER_CUT, f"the model collapsed: its loss sat at a random model's, "
                     f"ln({vocab_size}) = {ceiling(vocab_size):.4g} ({last}), after it had been below it "
                     f"({history.best:.4g} at step {history.best_step})", init_blown)
    if dead:
        return Cause("dead", START_OVER_CUT, f"training went non-finite at once from {_named(tuple(dead))} after "
                     "rolling back to it", init_blown)
    if one_step:
        return Cause("one_batch", 1, f"the loss was healthy ({last}): one bad batch")
    return Cause("recurring", 2, "", init_blown)


def renamed(run_name: str, lower: str) -> str:
    """The run's name for the new rate: a rate suffix the advice gave it before follows the rate."""
    return f"{RATE_SUFFIX.sub('', run_name)}-lr{lower}"


def launch_command(run_dir: Path, replaced: tuple[str, ...] = REPLACED) -> str:
    """The run's last launch (RUN_DIR/command.txt; a `cd LAUNCH_DIR &&` before it is kept) without the keys the
    advice sets; a placeholder for the overrides when it was started by hand (an sbatch script)."""
    try:
        lines = [line for line in (Path(run_dir) / "command.txt").read_text().splitlines() if line.strip()]
        if lines:
            words = shlex.split(lines[-1])
            cut = words.index("&&") + 1 if "&&" in words else 0
            prefix = f"{shlex.join(words[:cut - 1])} && " if cut else ""
            return prefix + shlex.join(_without(words[cut:], replaced))
    except (OSError, ValueError):
        pass
    return f"python -m launcher <your overrides> {shlex.quote(f'run.root={Path(run_dir).parent}')}"


def _without(args: list[str], keys: tuple[str, ...]) -> list[str]:
    return [a for a in args if a.split("=", 1)[0].lstrip("+~") not in keys]


def stop_advice(run_dir: Path, good: int | None, lr: float, run_name: str, cause: Cause | None = None, *,
                latest: int | None = None, blown: dict[int, str] | None = None) -> str:
    """What to do after a stop, as `cause` says: resume past one bad batch; else the last good checkpoint (`good`:
    before the trouble and good by targets.py; `blown`: the complete ones before the trouble that are not, and why) and
    a command from it at a rate that fits, or, with none, the command that starts the run over from the weights it
    started from. `latest`: the newest complete checkpoint, where the same command resumes."""
    cause = cause or Cause("recurring", 2)
    blown = blown or {}
    said = f"{cause.said}; " if cause.said else ""
    if cause.kind == "one_batch" and latest == good:
        return _resume_past(run_dir, good, run_name, said)
    cut = max(cause.cut, 2 if good is not None else START_OVER_CUT)
    lower, rate = f"{lr / cut:g}", "half" if cut == 2 else f"{cut}x lower"
    if good is None:
        return _start_over(run_dir, run_name, lower, rate, said, cause, blown)
    base = launch_command(run_dir)
    path = layout.step_dir(run_dir, good)
    cmd = f"{base} " + shlex.join([f"model.init_from={path}", f"run.name={renamed(run_name, lower)}", f"optim.lr={lower}"])
    return (f"nothing was checkpointed after the stop; {said}the last good checkpoint (before the trouble) is step "
            f"{good} ({path}){_not_good(blown)}. To go on from it with a lower learning rate ({rate}): {cmd} (a new "
            "run from its weights: the optimizer, the schedule and the data position start fresh); or look at the "
            "data of those steps (events.jsonl)")


def _resume_past(run_dir: Path, good: int | None, run_name: str, said: str) -> str:
    """One bad batch: the same run again, resumed (or, with no checkpoint, started) with the step not applied."""
    cmd = f"{launch_command(run_dir, RESUME_REPLACED)} " + shlex.join([f"run.name={run_name}",
                                                                      "stability.nonfinite=skip"])
    if good is None:
        where, rollback = "from the start (nothing was checkpointed before it)", ""
    else:
        where = f"from the last checkpoint (step {good}, before it)"
        rollback = " (or stability.nonfinite=rollback, which reloads the checkpoint and skips the samples)"
    return (f"nothing was checkpointed after the stop; {said}to run it on {where} with that step not applied, "
            f"reading on past its samples, at the same rate: {cmd}{rollback}; or look at the data of that step "
            "(events.jsonl)")


def _start_over(run_dir: Path, run_name: str, lower: str, rate: str, said: str, cause: Cause,
                blown: dict[int, str]) -> str:
    """The same run over (renamed for its rate where the advice named it for one), from the weights it started from
    (a fine-tuning run keeps its model.init_from), or from random weights where those were themselves broken."""
    keep_init = not cause.init_blown
    base = launch_command(run_dir, tuple(k for k in REPLACED if k != "model.init_from" or not keep_init))
    name = renamed(run_name, lower) if RATE_SUFFIX.search(run_name) else run_name
    overrides = [f"run.name={name}", f"optim.lr={lower}", "run.overwrite=true"]
    weights = "the weights it started from"
    if not keep_init:
        overrides.insert(0, "model.init_from=null")
        weights = f"random weights (those it started from {'were themselves ' * ('far' in cause.init_note)}" \
                  f"{cause.init_note})"
    cmd = f"{base} " + shlex.join(overrides)
    if blown:
        why = "; ".join(f"{_named(tuple(s for s in blown if blown[s] == w))}: {w}" for w in dict.fromkeys(blown.values()))
        none = f"no good checkpoint from before the trouble in {run_dir} ({why})"
    else:
        none = f"nothing was checkpointed before it (no complete checkpoint from before the trouble in {run_dir})"
    return f"{said}{none}; to start over from {weights} with a lower learning rate ({rate}): {cmd}"


def _not_good(blown: dict[int, str]) -> str:
    return "".join(f"; not {_named(tuple(s for s in blown if blown[s] == w))}: {w}" for w in dict.fromkeys(blown.values()))


def _named(steps: tuple[int, ...]) -> str:
    return f"step{'s' if len(steps) > 1 else ''} {', '.join(str(s) for s in steps)}"
