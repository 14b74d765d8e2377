"""Guards of the run directory at launch: model.init_from inside the run directory that run.overwrite=true clears
(launcher/plan/init_from.py), and an existing run directory that can't be written (launcher/run/rundir_paths.py), each one
`error:` line, exit 2, nothing changed; an OSError while preparing the directory is one line too (launcher/run/rundir.py).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.errors import EXIT_BAD_INPUT, ConfigError
from contract.rundir import ckpt_layout as layout
from launcher.compose import compose_config
from launcher.plan.init_from import refuse_inside_overwritten
from launcher.run.rundir import prepare
from launcher.run.rundir_paths import check_writable
from tests.conftest import ROOT, hq, launcher_env
from tests.forked_cli import run_module

SMALL = ["model.d_model=32", "model.n_layers=1", "model.ffn_hidden=64", "data.seq_len=16", "trainer.max_steps=10"]


def _launch(*overrides: str) -> subprocess.CompletedProcess[str]:
    return run_module("launcher", [*SMALL, *overrides], cwd=ROOT, env=launcher_env(), timeout=300)


def _snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in sorted(root.rglob("*"))}


def _run_with_checkpoint(run_dir: Path, step: int = 10) -> Path:
    folder = layout.step_dir(run_dir, step) / "model_optim"
    folder.mkdir(parents=True)
    (folder / ".metadata").write_bytes(b"weights")
    layout.write_marker(folder.parent, step=step)
    (run_dir / "metrics.jsonl").write_text('{"step": 10}\n')
    return layout.step_dir(run_dir, step)


# -- model.init_from inside the run directory that run.overwrite=true clears --------------------------------------
@pytest.mark.parametrize("form", ["run_dir", "checkpoints", "step", "file_inside", "symlink_to_step",
                                  "run_root_via_symlink", "checkpoints_symlinked_elsewhere"])
def test_init_from_inside_the_overwritten_run_is_refused_and_nothing_deleted(tmp_path: Path, form: str) -> None:
    root = tmp_path / "runs"
    run_dir = root / "self"
    run_dir.mkdir(parents=True)
    run_root = root
    if form == "checkpoints_symlinked_elsewhere":  # checkpoints/ -> a store outside; init_from names the store
        store = tmp_path / "store"
        store.mkdir()
        (run_dir / "checkpoints").symlink_to(store)
    step = _run_with_checkpoint(run_dir)
    init = {"run_dir": run_dir, "checkpoints": run_dir / "checkpoints", "step": step,
            "file_inside": step / "model_optim" / ".metadata", "symlink_to_step": tmp_path / "link",
            "run_root_via_symlink": step, "checkpoints_symlinked_elsewhere": tmp_path / "store" / step.name}[form]
    if form == "symlink_to_step":
        init.symlink_to(step)
    if form == "run_root_via_symlink":
        run_root = tmp_path / "root_link"
        run_root.symlink_to(root)
    before = _snapshot(tmp_path)
    out = _launch(f"model.init_from={hq(init)}", f"run.root={hq(run_root)}", "run.name=self", "run.resume=false",
                  "run.overwrite=true")
    assert out.returncode == EXIT_BAD_INPUT, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model.init_from="), out.stderr
    assert "lies inside the run directory" in lines[0] and "run.overwrite=true clears" in lines[0]
    assert "copy the weights elsewhere" in lines[0] and "another run.name" in lines[0]
    assert _snapshot(tmp_path) == before


def test_init_from_beside_the_run_or_without_overwrite_is_not_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "self"
    sibling = tmp_path / "self2"  # a name that starts with the run's: not inside it
    sibling.mkdir()
    run_dir.mkdir()
    cfg = compose_config([f"model.init_from={hq(sibling)}", "run.overwrite=true"])
    refuse_inside_overwritten(cfg, run_dir)
    cfg = compose_config([f"model.init_from={hq(run_dir)}", "run.overwrite=false"])
    refuse_inside_overwritten(cfg, run_dir)  # resuming or starting anew here deletes nothing
    cfg = compose_config([f"model.init_from={hq(run_dir)}", "run.overwrite=true"])
    with pytest.raises(ConfigError, match="lies inside the run directory"):
        refuse_inside_overwritten(cfg, run_dir)


# -- an existing run directory that can't be written ---------------------------------------------------------------
@pytest.fixture
def read_only_run(tmp_path: Path) -> Iterator[Path]:
    """RUN_ROOT/ro: an existing run directory (config and a checkpoint) on a read-only bind mount of itself."""
    run_dir = tmp_path / "runs" / "ro"
    run_dir.mkdir(parents=True)
    _run_with_checkpoint(run_dir)
    (run_dir / "config.yaml").write_text("# left by a run\n")
    subprocess.run(["mount", "-o", "bind,ro", str(run_dir), str(run_dir)], check=True, capture_output=True)
    try:
        yield run_dir
    finally:
        subprocess.run(["umount", str(run_dir)], check=True, capture_output=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount needs root")
@pytest.mark.parametrize("overwrite", ["false", "true"])
def test_a_read_only_run_directory_is_one_error_line_and_nothing_changed(read_only_run: Path,
                                                                         overwrite: str) -> None:
    before = _snapshot(read_only_run.parent)
    out = _launch(f"run.root={hq(read_only_run.parent)}", "run.name=ro", "run.resume=false",
                  f"run.overwrite={overwrite}")
    assert out.returncode == EXIT_BAD_INPUT, out.stderr
    assert out.stderr.splitlines() == [
        f"error: the run directory {read_only_run} can't be written (it is on a read-only file system): make it "
        "writable (remount it read-write, or chmod u+w), or pick another run.name or run.root to start a run "
        "elsewhere"], out.stderr
    assert _snapshot(read_only_run.parent) == before


def test_a_run_directory_without_write_permission_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # As root chmod a-w stops nothing, so the permission answer is what a user without it would get.
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(ConfigError, match=r"can't be written \(it is not writable for you\): make it writable"):
        check_writable(tmp_path)
    check_writable(tmp_path / "not-yet")  # created later: run.root's check covers it


def test_an_os_error_while_preparing_is_one_config_error(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "command.txt").mkdir(parents=True)  # in the way of the file the command is appended to
    cfg = compose_config([f"run.root={hq(tmp_path)}", "run.name=run"])
    with pytest.raises(ConfigError) as err:
        prepare(cfg, run_dir, argv=["launcher"])
    assert str(err.value).startswith(f"the run directory {run_dir} can't be prepared (Is a directory: "
                                     f"{run_dir / 'command.txt'}): make it writable")
