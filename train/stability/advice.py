"""The way on after stability stopped a run: a command that works as written (pure stdlib).

The resume checks refuse a changed optim.lr on the same run (launcher/checks/resume_checks.py), so "lower the rate and
run the same command" cannot work. With a good checkpoint the way on is a new run from its weights
(model.init_from: the optimizer, the schedule and the data position start fresh); with none, the same run over
(run.overwrite=true). The command is the run's own (RUN_DIR/command.txt, its last launch) with those keys replaced.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from train import ckpt_layout as layout

# Keys the advice sets: the run's own values of them are dropped from its command (a key twice is refused).
REPLACED = ("optim.lr", "run.name", "model.init_from", "run.overwrite", "run.resume")


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


def stop_advice(run_dir: Path, good: int | None, lr: float, run_name: str) -> str:
    """What to do after a stop: the last good checkpoint and a command from it at half the rate, or, with none,
    that nothing was checkpointed and the command that starts over at half the rate."""
    lower = f"{lr / 2:g}"
    if good is None:
        # The same run over: from the weights it started from (a run that fine-tunes keeps its model.init_from).
        base = launch_command(run_dir, tuple(k for k in REPLACED if k != "model.init_from"))
        cmd = f"{base} " + shlex.join([f"run.name={run_name}", f"optim.lr={lower}", "run.overwrite=true"])
        return (f"nothing was checkpointed before it (no complete checkpoint from before the trouble in {run_dir}). To "
                f"start over with a lower learning rate: {cmd}")
    base = launch_command(run_dir)
    path = layout.step_dir(run_dir, good)
    cmd = f"{base} " + shlex.join([f"model.init_from={path}", f"run.name={run_name}-lr{lower}", f"optim.lr={lower}"])
    return (f"nothing was checkpointed after the stop; the last good checkpoint (before the trouble) is step {good} "
            f"({path}). To go on from it "
            f"with a lower learning rate: {cmd} (a new run from its weights: the optimizer, the schedule and the data "
            "position start fresh); or look at the data of those steps (events.jsonl)")
