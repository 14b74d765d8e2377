"""launcher.status on a prepared dataset directory (issue 20): one row, complete or in progress, local or SLURM."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest

from contract.data import manifest as mf
from launcher import status
from tests.unit.test_prepare import _build_corpus, prepare
from tests.unit.test_status import FakeSlurm, sacct_line


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    """Only fake `squeue` and `sacct` on PATH (test_status's): a real SLURM client must not answer instead."""
    fake = FakeSlurm(tmp_path / "bin")
    monkeypatch.setenv("PATH", str(fake.bin_dir))
    return fake


@pytest.fixture
def prepared(tmp_path: Path) -> Path:
    """A small `bytes` preparation of several tasks, complete."""
    _build_corpus(tmp_path / "corpus")
    out = tmp_path / "data"
    code, err = prepare(tmp_path / "corpus", "--out", out, "--tokenizer", "bytes", "--task-mb", "0.0001",
                        "--val-fraction", "0.3")
    assert code == 0, err
    return out


def _row(out: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    assert status.main([str(out), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert len(rows) == 1
    return rows[0]


def _text(out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert status.main([str(out)]) == 0
    return capsys.readouterr().out


def test_a_complete_then_an_interrupted_local_preparation(
    prepared: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = mf.load_manifest(prepared)
    tasks = len(list((prepared / ".parts").glob("0*.json")))
    assert tasks > 3
    row = _row(prepared, capsys)
    assert row["kind"] == "prepared dataset" and row["state"] == "complete" and row["job"] == "local"
    assert (row["tasks_complete"], row["tasks_total"]) == (tasks, tasks)
    assert (row["train_tokens"], row["train_documents"]) == (manifest.split("train").tokens,
                                                            manifest.split("train").documents)
    assert (row["val_tokens"], row["val_documents"]) == (manifest.split("val").tokens, manifest.split("val").documents)
    assert row["tokenizer"].startswith("bytes") and f"data.path={prepared}" in row["next"]
    text = _text(prepared, capsys)
    assert "complete" in text and f"{tasks}/{tasks}" in text and f"{manifest.split('train').tokens:,}" in text

    # Stopped half way: no manifest, two tasks' records gone (one by its shard cut short): the rest are counted.
    (prepared / mf.MANIFEST).unlink()
    (prepared / ".parts/00001.json").unlink()
    (prepared / "train/00002.bin").write_bytes(b"\0")
    done = [json.loads((prepared / f".parts/{i:05d}.json").read_text()) for i in range(tasks) if i not in (1, 2)]
    row = _row(prepared, capsys)
    assert row["state"] == "incomplete-resumable" and row["slurm_state"] is None
    assert (row["tasks_complete"], row["tasks_total"]) == (tasks - 2, tasks)
    assert row["train_tokens"] == sum(r["shards"]["train"]["tokens"] for r in done if r["shards"]["train"])
    assert row["train_tokens"] < manifest.split("train").tokens
    assert "launcher.prepare" in row["next"] and "2 missing tasks" in row["next"]
    assert "incomplete-resumable" in _text(prepared, capsys)

    # A local preparation writing it holds the directory's lock.
    fd = os.open(prepared, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert _row(prepared, capsys)["state"] == "preparing"
    finally:
        os.close(fd)
    assert _row(prepared, capsys)["state"] == "incomplete-resumable"  # and no lock is left behind


def test_a_preparation_on_slurm_preparing_then_failed(
    prepared: Path, slurm: FakeSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    (prepared / mf.MANIFEST).unlink()
    (prepared / ".parts/00000.json").unlink()
    (prepared / ".parts/jobs.txt").write_text("57\n58\n")
    slurm.answer("squeue", "57", "RUNNING")
    row = _row(prepared, capsys)
    assert (row["state"], row["slurm_state"], row["job"]) == ("preparing", "RUNNING", "57,58")
    assert "squeue -j 57,58" in row["next"] and "scancel 57 58" in row["next"]
    assert "preparing (RUNNING)" in _text(prepared, capsys)

    slurm.answer("squeue", "57")
    slurm.answer("sacct", "58", sacct_line("58", "FAILED", 3, 0, 1))
    row = _row(prepared, capsys)
    assert (row["state"], row["slurm_state"]) == ("failed", "FAILED")
    assert "1 missing task run" in row["next"] and ".parts/slurm" in row["next"]

    # Resubmitted (jobs.txt appends the new pair): the newest submission is the one shown.
    (prepared / ".parts/jobs.txt").write_text("57\n58\n70\n71\n")
    slurm.answer("squeue", "70", "PENDING")
    assert _row(prepared, capsys)["job"] == "70,71"


def test_watch_and_a_damaged_plan(prepared: Path, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(status.time, "sleep", interrupted)
    assert status.main([str(prepared), "--watch", "2"]) == 0
    assert "complete" in capsys.readouterr().out

    (prepared / mf.MANIFEST).unlink()
    (prepared / ".parts/plan.json").write_text("{")
    assert status.main([str(prepared)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "--overwrite" in err


def test_a_folder_of_prepared_datasets_has_one_row_each(prepared: Path, slurm: FakeSlurm,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """`launcher.status corpus/` on a folder of datasets: one row per dataset, as for a folder of runs."""
    import shutil

    corpus = prepared.parent / "corpus_out"
    shutil.copytree(prepared, corpus / "books")
    shutil.copytree(prepared, corpus / "web")
    (corpus / "web" / mf.MANIFEST).unlink()  # stopped before the end
    (corpus / "notes").mkdir()  # not a dataset: no row
    assert status.main([str(corpus), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["name"], r["kind"], r["state"]) for r in rows] == [("books", "prepared dataset", "complete"),
                                                                  ("web", "prepared dataset", "incomplete-resumable")]
    text = _text(corpus, capsys)
    assert "books" in text and "web" in text and "incomplete-resumable" in text
    assert f"web: tokenizer {rows[1]['tokenizer']}; next: " in text


def test_a_path_that_is_no_directory_names_everything_status_reads(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """status reads prepared datasets and searches too; its refusal named only runs, sweeps and run roots."""
    assert status.main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a prepared dataset (or a folder of them)" in err and "search" in err, err
