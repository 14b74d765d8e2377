"""Where checkpoints live and which ones count. Pure stdlib: the launcher reads it on a login node too.

    RUN_DIR/checkpoints/step_<N>/
        model_optim/        torch.distributed.checkpoint (DCP) shards, or the DeepSpeed engine's files
        trainer_state.pt    step, tokens, data position, scheduler, scaler, wandb run id, the stability
                            checks' state (train/stability/runner.py) (rank 0)
        rng_rank<R>.pt      python, numpy, torch CPU and CUDA RNG states of rank R
        config.yaml         the resolved config this checkpoint was trained with
        COMPLETE            written last, by rank 0, once every rank's files are on disk (JSON: step, world
                            size, data fingerprint, `verified`: the replicas agreed at this step, `loss`: the
                            step's loss averaged over the ranks, "nan" or "inf" when not finite, `best`: the
                            run's lowest loss up to it, `snapshot`: the id of the +remote snapshot whose code
                            trained it, when the run was launched from one: contract/remote_snapshot.py)

A checkpoint without COMPLETE was interrupted (preemption, SIGKILL, node failure) and is never loaded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from contract.remote_snapshot import current_snapshot_id

MARKER = "COMPLETE"
STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass(frozen=True)
class CheckpointDir:
    step: int
    path: Path

    @property
    def complete(self) -> bool:
        return (self.path / MARKER).is_file()


def checkpoints_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_dir(run_dir: Path, step: int) -> Path:
    return checkpoints_root(run_dir) / f"step_{step}"


def list_checkpoints(run_dir: Path) -> list[CheckpointDir]:
    root = checkpoints_root(run_dir)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = STEP_DIR.match(entry.name)
        if match and entry.is_dir():
            found.append(CheckpointDir(int(match.group(1)), entry))
    return sorted(found, key=lambda c: c.step)


def latest_complete_checkpoint(run_dir: Path) -> CheckpointDir | None:
    complete = [c for c in list_checkpoints(run_dir) if c.complete]
    return complete[-1] if complete else None


def incomplete_checkpoints(run_dir: Path) -> list[CheckpointDir]:
    return [c for c in list_checkpoints(run_dir) if not c.complete]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_marker(path: Path, **info: object) -> None:
    # Write-then-rename so the marker itself can never be seen half-written; fsync the file and the directory
    # so that after a node crash a marker on disk means the files it vouches for are on disk too.
    tmp = path / f".{MARKER}.tmp"
    snapshot = current_snapshot_id()  # the code that trained it: a resume with other code says so (its plan)
    info = {**info, **({"snapshot": snapshot} if snapshot else {})}
    write_durably(tmp, (json.dumps({"time": time.time(), **info}) + "\n").encode())
    tmp.rename(path / MARKER)
    fsync_dir(path)


def marker(checkpoint: CheckpointDir) -> dict[str, object]:
    """What the checkpoint's COMPLETE marker records ({} when it can't be read)."""
    try:
        info = json.loads((checkpoint.path / MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def verified(checkpoint: CheckpointDir) -> bool:
    """Whether the replicas were checked and agreed when the checkpoint was saved (its marker says so)."""
    return marker(checkpoint).get("verified") is True


def marker_losses(checkpoint: CheckpointDir) -> tuple[float | None, float | None]:
    """The loss at the checkpoint's step and the run's best up to it, as its marker records them (None: a marker
    written without them)."""
    info = marker(checkpoint)
    return _number(info.get("loss")), _number(info.get("best"))


def _number(value: object) -> float | None:
    """A marker's number; "nan" and "inf" stand for the values JSON has no words for."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    try:
        return float(value) if value in ("nan", "inf", "-inf") else None  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def to_delete(checkpoints: list[CheckpointDir], keep_last: int, keep_every: int) -> list[CheckpointDir]:
    """Retention: keep the newest `keep_last` complete checkpoints and every `keep_every`-th step.

    Incomplete checkpoints older than the newest complete one are garbage; newer ones may still be written.
    """
    complete = [c for c in checkpoints if c.complete]
    if not complete:
        return []
    newest = complete[-1].step
    keep = {c.step for c in complete[-keep_last:]} if keep_last > 0 else {newest}
    if keep_every > 0:
        keep |= {c.step for c in complete if c.step % keep_every == 0}
    doomed = [c for c in complete if c.step not in keep]
    doomed += [c for c in checkpoints if not c.complete and c.step < newest]
    return sorted(doomed, key=lambda c: c.step)


def remove(checkpoint: CheckpointDir) -> None:
    # Drop the marker first: a crash half-way through the delete leaves an incomplete (ignored) directory,
    # never a "complete" one with missing shards.
    (checkpoint.path / MARKER).unlink(missing_ok=True)
    shutil.rmtree(checkpoint.path, ignore_errors=True)
