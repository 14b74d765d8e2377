"""The plan's code line when a run resumes from a +remote snapshot other than the one its checkpoint was trained with
(an edit, then a resubmission that extends the run): which files changed, and a refusal before anything is submitted
when the checkpoint's parameters (names, shapes) do not fit the model the new code builds.

The checkpoint's COMPLETE marker names the snapshot that trained it (contract/rundir/ckpt_layout.py); older
checkpoints, the run's environment.json (its last launch's). The two manifests sit side by side in WORKDIR/snapshots/.
The names and shapes are compared in a child (`python -m launcher.worker --init-from`, as model.init_from's are:
the model on the meta device against the checkpoint's metadata), only when the code changed; this module stays
torch-free.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from contract.errors import ConfigError
from contract.remote_snapshot import manifest_changes, read_manifest
from contract.rundir import ckpt_layout as layout
from launcher.plan.probe import ask

_SHOWN = 6


def trained_by(run_dir: Path, checkpoint: layout.CheckpointDir) -> str | None:
    """The id of the snapshot whose code wrote CHECKPOINT: its marker's, else the run's last launch's."""
    snapshot = layout.marker(checkpoint).get("snapshot")
    if snapshot:
        return str(snapshot)
    try:
        recorded = json.loads((run_dir / "environment.json").read_text()).get("snapshot") or {}
    except (OSError, ValueError, AttributeError):
        return None
    return str(recorded["id"]) if isinstance(recorded, dict) and recorded.get("id") else None


def code_lines(cfg: DictConfig, run_dir: Path, checkpoint: layout.CheckpointDir,
               launch_dir: Path | None = None) -> tuple[str, ...]:
    """'code: ...' when the snapshot launching this resume is not the one CHECKPOINT was trained with (() when it
    is, or when either is unknown); ConfigError when the checkpoint does not fit the model this code builds."""
    here = launch_dir or Path.cwd()
    current = read_manifest(here)
    old_id = trained_by(run_dir, checkpoint)
    if current is None or not old_id or old_id == current.get("id"):
        return ()
    new_id = str(current.get("id"))
    old = read_manifest(here.parent / old_id)
    if old is None:
        what = f"snapshot {old_id}'s files are no longer on the cluster: which files changed is unknown"
    else:
        changed = manifest_changes(old, current)
        more = [f"{len(changed) - _SHOWN} more"] if len(changed) > _SHOWN else []
        what = f"changed: {', '.join(changed[:_SHOWN] + more) or 'no file (only the executable bits)'}"
    line = (f"code: snapshot {new_id} is not snapshot {old_id}, which trained {checkpoint.path.name}; {what}")
    # `code`: the answer is the snapshot's (one launcher process asks once per request)
    request = {"model": OmegaConf.to_container(cfg.model, resolve=True), "resume_from": str(checkpoint.path),
               "code": new_id}
    answer = ask(request, "--init-from")
    if answer.get("kind") == "config":
        raise ConfigError(f"{answer['error']} ({line.removeprefix('code: ')})")
    if "resume_tensors" in answer:
        return (f"{line}; the checkpoint's {answer['resume_tensors']} tensors fit the model it builds",)
    why = answer.get("error") or answer.get("note") or "the model was not built"
    return (f"{line}; not compared with the model it builds ({why}): a checkpoint that does not fit fails to load",)
