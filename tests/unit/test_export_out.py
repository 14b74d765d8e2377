"""`python -m launcher.export --out PATH` where PATH can't be written (a pseudo filesystem, under a file, a read-only
directory): one `error:` line naming the path and the fix, exit 2, refused before the checkpoint is read, and
nothing left behind (no temporary file, no parent directory)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.rules.hf_config import HF_TARGET
from launcher import export

NOBODY = 65534
FIX = "pass --out PATH in a directory you can write"


def fake_run(root: Path) -> Path:
    """A run with a complete checkpoint that holds no weights: an export that got past the checks would crash."""
    step = root / "run" / "checkpoints" / "step_5"
    step.mkdir(parents=True)
    (step / "COMPLETE").write_text("{}\n")
    (step / "config.yaml").write_text(json.dumps({"model": {"name": "llama", "_target_": HF_TARGET,
                                                            "config_path": "/nonexistent"}}))
    return root / "run"


def tree(*dirs: Path) -> list[Path]:
    return sorted(p for d in dirs for p in d.rglob("*"))


@pytest.mark.parametrize("fmt", ["safetensors", "hf"])
@pytest.mark.parametrize("out", ["/proc/x.safetensors", "/proc/new/dir/x", "A_FILE/x.safetensors"])
def test_an_out_path_that_cannot_be_written_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         fmt: str, out: str) -> None:
    run = fake_run(tmp_path)
    (tmp_path / "a file").write_text("not a directory")
    out = out.replace("A_FILE", str(tmp_path / "a file"))
    before = tree(tmp_path)
    assert export.main([str(run), "--format", fmt, "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: cannot write {out} (") and FIX in err, err
    assert tree(tmp_path) == before and not Path(out).exists() and not Path("/proc/new").exists()


@contextlib.contextmanager
def as_user(uid: int) -> Iterator[None]:
    """Run as another user when the tests run as root (root writes into a read-only directory anyway)."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user can read (pytest's tmp_path is private to its owner)."""
    path = Path(tempfile.mkdtemp(prefix="export-out-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.mark.parametrize("fmt", ["safetensors", "hf"])
@pytest.mark.parametrize("name", ["x.safetensors", "new/dir/x"])
def test_a_read_only_directory_is_one_line_and_nothing_is_left_in_it(shared_dir: Path,
                                                                     capsys: pytest.CaptureFixture[str], fmt: str,
                                                                     name: str) -> None:
    run = fake_run(shared_dir)
    (shared_dir / "ro").mkdir(mode=0o555)
    (shared_dir / "ro").chmod(0o555)
    before = tree(shared_dir)
    out = shared_dir / "ro" / name
    with as_user(NOBODY):
        code = export.main([str(run), "--format", fmt, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith(f"error: cannot write {out} (Permission denied in ") and FIX in err
    assert tree(shared_dir) == before


class SafetensorError(Exception):
    """Named as safetensors' own error, which it raises for I/O failures too."""


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"),
                                   SafetensorError("Error while serializing: I/O error: No space left on device")])
def test_a_write_that_fails_half_way_leaves_nothing_behind(tmp_path: Path, error: Exception) -> None:
    """The checks passed but the write failed (disk full): what it created, temporary files included, is removed."""
    (tmp_path / "old.safetensors").write_text("an earlier export")
    out = tmp_path / "new" / "dir" / "x.safetensors"

    def write() -> None:
        out.parent.mkdir(parents=True)
        (out.parent / ".tmpAbC").write_text("half")
        (tmp_path / ".tmpXyZ").write_text("half")
        raise error

    with pytest.raises(export.ConfigError, match=r"^cannot write .*x\.safetensors \(.*No space left on device\): "
                                                  "pass --out PATH in a directory you can write"):
        export.write_or_clean_up(out, write)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.safetensors"]


def test_a_failure_that_is_not_a_write_error_is_not_hidden(tmp_path: Path) -> None:
    def write() -> None:
        raise ValueError("the checkpoint does not match the config")

    with pytest.raises(ValueError, match="does not match"):
        export.write_or_clean_up(tmp_path / "x.safetensors", write)
