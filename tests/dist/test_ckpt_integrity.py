"""Checkpoint integrity: every checkpoint carries a manifest of its files' sizes and CRC-32s; a newest checkpoint
damaged after its COMPLETE marker was written is reported, moved aside (kept) and the previous complete one
resumes, ending with the loss an uninterrupted run reaches; when every one is damaged the resume stops, saying so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.errors import EXIT_STOPPED
from tests.conftest import hq, launch, read_metrics
from train.checkpoints import manifest as ckpt_manifest

pytestmark = pytest.mark.dist

STEPS = 14
COMMON = ["trainer.max_steps=14", "trainer.log_every=1", "trainer.ckpt_every=4", "local.nproc=2",
          "logger.backend=none"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    root = tmp_path_factory.mktemp("whole")
    out = launch(*COMMON, f"run.root={root}", "run.name=whole")
    assert out.returncode == 0, out.stderr[-3000:]
    step_dir = root / "whole" / "checkpoints" / f"step_{STEPS}"
    # The manifest lists every file of every rank with its size and checksum, and they check out.
    listed = {}
    for piece in (step_dir / "manifest").glob("rank*.json"):
        listed.update(json.loads(piece.read_text())["files"])
    assert {"model_optim/__0_0.distcp", "model_optim/__1_0.distcp", "model_optim/.metadata", "rng_rank0.pt",
            "rng_rank1.pt", "trainer_state.pt", "config.yaml"} <= set(listed)
    assert ckpt_manifest.verify(step_dir, full=True) is None
    return {r["step"]: r["loss"] for r in read_metrics(root / "whole")}


def _damage(shard: Path, how: str) -> None:
    data = bytearray(shard.read_bytes())
    if how == "truncate":
        shard.write_bytes(data[: len(data) // 2])
    else:  # same size, one byte changed: only the checksum can tell
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))


# End to end with the harder damage: one byte changed at the same size, which only checkpoint.verify=full catches.
# Truncation, caught by the size check every resume makes, is the same path (checked on its own below).
@pytest.mark.parametrize(("how", "verify"), [("alter", "full")])
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_previous_one_resumes(
        how: str, verify: str, run_root: Path, uninterrupted: dict[int, float]) -> None:
    common = [*COMMON, f"run.root={hq(run_root)}", "run.name=damaged", f"checkpoint.verify={verify}"]
    stopped = launch(*common, SLURMTRAIN_TEST_SIGNAL="10:0")
    assert stopped.returncode == EXIT_STOPPED, stopped.stderr[-3000:]
    checkpoints = run_root / "damaged" / "checkpoints"
    assert (checkpoints / "step_10" / "COMPLETE").is_file() and (checkpoints / "step_8" / "COMPLETE").is_file()
    _damage(checkpoints / "step_10" / "model_optim" / "__1_0.distcp", how)

    resumed = launch(*common)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "checkpoint step 10 is damaged (model_optim/__1_0.distcp" in resumed.stderr
    assert "resumed from" in resumed.stderr and "step 8," in resumed.stderr
    # Moved aside, not deleted; the run saved a fresh step 10 on its way to the end.
    kept = list((checkpoints / "quarantine").glob("step_10-*"))
    assert len(kept) == 1 and (kept[0] / "model_optim" / "__1_0.distcp").is_file()
    got = {r["step"]: r["loss"] for r in read_metrics(run_root / "damaged")}
    assert got == uninterrupted  # every step once, bitwise the uninterrupted run's


def test_when_every_checkpoint_is_damaged_the_resume_stops_saying_so(run_root: Path) -> None:
    """The run started over from step 1 in silence (its plan had said it resumes after the newest step). Each is
    moved aside, and the ranks end with one line naming the way out, exit 2."""
    common = ["trainer.max_steps=6", "trainer.ckpt_every=2", "logger.backend=none", f"run.root={hq(run_root)}",
              "run.name=all"]
    stopped = launch(*common, SLURMTRAIN_TEST_SIGNAL="3:0")
    assert stopped.returncode == EXIT_STOPPED, stopped.stderr[-3000:]
    checkpoints = run_root / "all" / "checkpoints"
    for step in (2, 3):
        _damage(checkpoints / f"step_{step}" / "model_optim" / "__0_0.distcp", "truncate")
    again = launch(*common)
    assert again.returncode != 0 and "step 1/6" not in again.stderr, again.stderr[-3000:]
    assert (f"error: every complete checkpoint of {run_root / 'all'} is damaged" in again.stderr
            and "start over with run.resume=false run.overwrite=true" in again.stderr), again.stderr[-3000:]
    assert len(list((checkpoints / "quarantine").iterdir())) == 2


def test_without_full_verification_an_altered_shard_of_the_same_size_passes_the_size_check(tmp_path: Path) -> None:
    step = tmp_path / "step_1"
    (step / "model_optim").mkdir(parents=True)
    (step / "model_optim" / "__0_0.distcp").write_bytes(b"abcdef")
    (step / "rng_rank1.pt").write_bytes(b"xyz")
    ckpt_manifest.write_piece(step, 0)
    ckpt_manifest.write_piece(step, 1)
    assert set(json.loads((step / "manifest" / "rank1.json").read_text())["files"]) == {"rng_rank1.pt"}
    (step / "model_optim" / "__0_0.distcp").write_bytes(b"abcdeF")
    assert ckpt_manifest.verify(step, full=False) is None
    assert "does not match its checksum" in str(ckpt_manifest.verify(step, full=True))
    (step / "model_optim" / "__0_0.distcp").write_bytes(b"abc")
    assert ckpt_manifest.verify(step, full=False) == "model_optim/__0_0.distcp has 3 bytes, 6 were written"
    (step / "model_optim" / "__0_0.distcp").write_bytes(b"abcdef")
    (step / "rng_rank1.pt").unlink()
    assert ckpt_manifest.verify(step, full=False) == "rng_rank1.pt is missing"
