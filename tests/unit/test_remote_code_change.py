"""A resume launched from another +remote snapshot than the one its checkpoint was trained with
(launcher/plan/code_change.py): the plan names the files changed, and a checkpoint that does not fit the model the new
code builds is refused before anything is submitted. The real sshd and SLURM: tests/slurm/test_remote.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from omegaconf import OmegaConf

from contract.config.remote import RemoteConfig
from contract.errors import ConfigError
from contract.remote_snapshot import MANIFEST, manifest_changes
from contract.rules.init_source import MODEL_DIR
from contract.rundir import ckpt_layout as layout
from launcher.plan.code_change import code_lines
from launcher.plan.init_from import weights_lines
from launcher.run.remote import snapshot
from tests.conftest import copy_example

MODEL = {"_target_": "model.ConvLM", "vocab_size": 32, "max_seq_len": 16,
         "args": {"vocab_size": 32, "dim": 16, "layers": 2, "kernel": 3, "hidden": 24}}


def _ship(project: Path, snaps: Path) -> Path:
    """The project as a snapshot on the 'cluster': its files and manifest under SNAPS/ID."""
    snap = snapshot.take(project, RemoteConfig(name="t", host="h"))
    where = snaps / snap.id
    for f in snap.files:
        (where / f.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(project / f.path, where / f.path)
    (where / MANIFEST).write_text(json.dumps(snap.manifest))
    return where


def test_the_manifests_changes_name_each_file() -> None:
    def files(**sha: str) -> dict:
        return {"files": [{"path": p, "sha256": s, "executable": False} for p, s in sha.items()]}

    assert manifest_changes(files(a="1", b="2", c="3"), files(a="1", b="9", d="4")) == ["b", "c (removed)", "d (new)"]
    assert manifest_changes(files(a="1"), files(a="1")) == []


def test_a_resume_with_changed_code_says_so_and_refuses_a_checkpoint_that_does_not_fit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = copy_example(tmp_path)
    snaps = tmp_path / "work" / "snapshots"
    trained = _ship(project, snaps)
    run_dir = tmp_path / "work" / "outputs" / "r"
    # The checkpoint the first launch's ranks wrote, from snapshot `trained` (their working directory).
    monkeypatch.chdir(trained)
    monkeypatch.syspath_prepend(str(trained))
    from model import ConvLM  # the project's own model, as the snapshot holds it

    step = layout.step_dir(run_dir, 4)
    model = ConvLM(**MODEL["args"])
    dcp.save({"app": {"model": model.state_dict()}}, checkpoint_id=str(step / MODEL_DIR), no_dist=True)
    layout.write_marker(step, step=4)
    assert layout.marker(layout.CheckpointDir(4, step))["snapshot"] == trained.name  # the code that trained it
    cfg = OmegaConf.create({"model": MODEL, "run": {"resume": True, "overwrite": False},
                            "trainer": {"seed": 1}})
    latest = layout.latest_complete_checkpoint(run_dir)
    assert latest is not None and code_lines(cfg, run_dir, latest) == ()  # the same code: nothing to say

    # An edit that keeps the parameters: said, with the file, and the checkpoint fits.
    source = (project / "model.py").read_text()
    (project / "model.py").write_text(source + "\n# a comment\n")
    commented = _ship(project, snaps)
    monkeypatch.chdir(commented)
    assert weights_lines(cfg, run_dir, 1) == (
        "weights: the run's checkpoint step_4",
        f"code: snapshot {commented.name} is not snapshot {trained.name}, which trained step_4; changed: model.py; "
        f"the checkpoint's {len(model.state_dict())} tensors fit the model it builds")

    # An edit that adds a parameter: refused before anything is submitted, naming it and what changed.
    (project / "model.py").write_text(source.replace(
        "        self.norm = nn.LayerNorm(dim)\n", "        self.norm = nn.LayerNorm(dim)\n"
        "        self.extra = nn.Linear(dim, dim)\n", 1))
    (project / "notes.txt").write_text("new\n")
    grown = _ship(project, snaps)
    monkeypatch.chdir(grown)
    with pytest.raises(ConfigError) as refused:
        weights_lines(cfg, run_dir, 1)
    said = str(refused.value)
    assert said.startswith(f"the checkpoint this run resumes, {step} does not fit the model: "), said
    assert "extra.weight" in said and "resume with the code that trained it, or start a new run" in said
    assert said.endswith(f"(snapshot {grown.name} is not snapshot {trained.name}, which trained step_4; changed: "
                         "model.py, notes.txt (new))"), said

    # The snapshot that trained it is gone: the plan says which files changed is unknown.
    shutil.rmtree(trained)
    monkeypatch.chdir(commented)
    assert weights_lines(cfg, run_dir, 1)[1].startswith(
        f"code: snapshot {commented.name} is not snapshot {trained.name}, which trained step_4; snapshot "
        f"{trained.name}'s files are no longer on the cluster: which files changed is unknown;")
    assert torch.__version__  # torch is this test's, never the launcher's
