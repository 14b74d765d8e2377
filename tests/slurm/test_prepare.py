"""python -m launcher.prepare ... +cluster=local_slurm: one CPU job array and a finalize job on the real local
cluster, its output byte-identical to the local preparation's (issue 20, acceptance 3), a corpus as it comes
(binary files and text that is not UTF-8 skipped, --exclude; issue 27) included."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from contract.data import manifest as mf
from tests.slurm.helpers import wait_terminal
from tests.unit import test_prepare as unit
from tests.unit.test_prepare import _add_misfits, _build_corpus, _tree, prepare

pytestmark = pytest.mark.slurm
bpe = unit.bpe  # the BPE trained in the unit tests' fixture


def _prepare_on_slurm(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launcher.prepare", *map(str, args), "+cluster=local_slurm"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _status(out: Path) -> dict:
    shown = subprocess.run([sys.executable, "-m", "launcher.status", str(out), "--json"], capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)["rows"][0]


def test_prepare_as_one_array_is_byte_identical_to_the_local_preparation(tmp_path: Path, bpe: Path) -> None:
    _build_corpus(tmp_path / "corpus")
    misfits = _add_misfits(tmp_path / "corpus")
    args = (tmp_path / "corpus", "--tokenizer", bpe, "--val-fraction", 0.3, "--task-mb", 0.0001,
            "--exclude", "koi8r.py")
    out = tmp_path / "on slurm's side"  # shell-hostile on purpose
    submitted = _prepare_on_slurm(*args, "--out", out)
    assert submitted.returncode == 0, submitted.stderr
    match = re.search(r"array (\d+) \((\d+) tasks?.*finalize job (\d+)", submitted.stdout)
    assert match, submitted.stdout
    array_id, tasks, final_id = match.group(1), int(match.group(2)), match.group(3)
    assert tasks > 3  # a task per group of about --task-mb of input files
    assert f"python -m launcher.status {shlex.quote(str(out))}" in submitted.stdout
    row = _status(out)  # queued or already done: the newest submission's jobs, the tasks counted
    assert row["job"] == f"{array_id},{final_id}" and row["tasks_total"] == tasks
    assert row["state"] in ("preparing", "complete"), row
    assert wait_terminal(final_id, timeout=300) == "COMPLETED", (out / ".parts/slurm").iterdir()
    row = _status(out)
    assert (row["state"], row["tasks_complete"]) == ("complete", tasks), row
    # Each task's end reaches the accounting on its own (after the finalize job's, under load): wait for each.
    assert [wait_terminal(f"{array_id}_{i}", timeout=120) for i in range(tasks)] == ["COMPLETED"] * tasks

    assert prepare(*args, "--out", tmp_path / "here")[0] == 0
    here, there = _tree(tmp_path / "here"), _tree(out)
    assert {k: v for k, v in there.items() if not k.startswith(".parts/")} == {
        k: v for k, v in here.items() if not k.startswith(".parts/")
    }
    assert mf.load_manifest(out).fingerprint == mf.load_manifest(tmp_path / "here").fingerprint
    manifest = mf.load_manifest(out)  # skipped in the array's tasks, counted by the finalize job
    assert manifest.selection["exclude"] == ["koi8r.py"]
    assert {r: len(s.paths) for r, s in manifest.skipped.items()} == {
        "binary": len(misfits["binary"]), "not_utf8": len(misfits["not_utf8"]) - 1
    }

    again = _prepare_on_slurm(*args, "--out", out)  # complete: nothing is queued
    assert again.returncode == 0 and "already prepared" in again.stdout, again.stdout + again.stderr
