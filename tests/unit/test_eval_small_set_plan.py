"""The launch plan warns about a validation set smaller than one pass (eval.batches x the global batch), in the
words the ranks use at the first pass (contract/rules/eval_sets.py repeat_warning): a warning, never a refusal."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from launcher.compose import compose_and_plan
from tests.conftest import ROOT, launcher_env
from tests.forked_cli import run_module
from tests.prepared_data import random_shards, write_prepared

# The tiny model's defaults: data.seq_len=64, global batch 8 on one rank, eval.batches=4: a pass reads 32 samples.
PASS = 32
SEQ_LEN = 64


def _tokens(path: Path, samples: int) -> Path:
    """A token file of exactly `samples` windows (a window is data.seq_len + 1 tokens, consecutive ones overlap)."""
    (np.arange(samples * SEQ_LEN + 1) % 256).astype(np.uint16).tofile(path)
    return path


def _dry_run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return run_module("launcher", ["launcher.dry_run=true", f"run.root={tmp_path / 'runs'}", "eval.every=5",
                                   *overrides], cwd=ROOT, env=launcher_env(), timeout=300)


def _warnings(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("warning: validation set")]


def test_a_dry_run_warns_about_a_tokens_set_smaller_than_a_pass_and_exits_0(tmp_path: Path) -> None:
    small = _tokens(tmp_path / "small.bin", PASS - 1)
    out = _dry_run(tmp_path, "eval.sets.small.kind=tokens", f"eval.sets.small.path={small}")
    assert out.returncode == 0, out.stderr
    assert _warnings(out.stderr) == [
        f"warning: validation set small holds {PASS - 1} samples and a pass reads {PASS} (eval.batches=4 x the global "
        "batch 8): it reads some samples more than once, and they weigh more in its loss; set eval.batches=3 (24 "
        f"samples) or give the set at least {PASS} samples"], out.stderr
    assert "error:" not in out.stderr and "dry run: nothing run" in out.stderr
    assert not (tmp_path / "runs").exists()


def test_a_set_of_exactly_one_pass_or_more_gets_no_warning(tmp_path: Path) -> None:
    exact, big = _tokens(tmp_path / "exact.bin", PASS), _tokens(tmp_path / "big.bin", 5 * PASS)
    out = _dry_run(tmp_path, "eval.sets.exact.kind=tokens", f"eval.sets.exact.path={exact}",
                   "eval.sets.big.kind=tokens", f"eval.sets.big.path={big}")
    assert out.returncode == 0, out.stderr
    assert "validation: every 5 steps" in out.stderr  # the plan was printed, with its validation line
    assert _warnings(out.stderr) == [], out.stderr


def test_evaluation_jobs_plans_warn_too_and_only_about_val_and_tokens_sets(tmp_path: Path) -> None:
    # Two ranks on local_slurm: the global batch is 16 and a pass 64 samples. A prepared directory's validation
    # split of 20 samples (kind=val) warns; its train split of 100 (kind=tokens) and the synthetic stream do not.
    write_prepared(tmp_path / "prep", random_shards(1, [100 * SEQ_LEN + 1]), val=random_shards(2, [20 * SEQ_LEN + 1]),
                   vocab=256, eod_id=255)
    _, plan = compose_and_plan(["+cluster=local_slurm", f"run.root={tmp_path / 'runs'}", "eval.async_jobs=true",
                                "eval.sets.held.kind=val", f"eval.sets.held.path={tmp_path / 'prep'}",
                                "eval.sets.train.kind=tokens", f"eval.sets.train.path={tmp_path / 'prep'}",
                                "eval.sets.syn.kind=synthetic"])
    assert plan.refusal == ""
    assert _warnings(plan.summary()) == [
        "warning: validation set held holds 20 samples and a pass reads 64 (eval.batches=4 x the global batch 16): it "
        "reads some samples more than once, and they weigh more in its loss; set eval.batches=1 (16 samples) or give "
        "the set at least 64 samples"]


@pytest.mark.parametrize("samples", [3, 7])
def test_a_set_smaller_than_one_batch_names_one_batch_as_the_fix(tmp_path: Path, samples: int) -> None:
    small = _tokens(tmp_path / "tiny.bin", samples)
    _, plan = compose_and_plan([f"run.root={tmp_path / 'runs'}", "eval.every=5", "eval.sets.tiny.kind=tokens",
                                f"eval.sets.tiny.path={small}"])
    assert _warnings(plan.summary()) == [
        f"warning: validation set tiny holds {samples} samples and a pass reads {PASS} (eval.batches=4 x the global "
        "batch 8): it reads some samples more than once, and they weigh more in its loss; give the set at least 8 "
        f"samples (one batch) and {PASS} for eval.batches=4"]
