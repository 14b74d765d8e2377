"""A two-source mixture resumes exactly: trained on 2 ranks, stopped, resumed on 1 rank, stopped, resumed on 2, it
trains on the very samples of an uninterrupted run, and metrics.jsonl's per-source tokens match the weights. A
relaunch with other weights is refused unless data.allow_changed=true."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from contract.errors import EXIT_STOPPED
from tests.conftest import hq, launch, read_metrics, traced_samples
from tests.prepared_data import write_prepared

pytestmark = pytest.mark.dist

STEPS, GLOBAL = 12, 16
WEIGHTS = {"code": 0.7, "web": 0.3}


def _sources(root: Path) -> dict[str, str]:
    # code: a prepared dataset of two shards, learnable (a repeating pattern); web: a glob of two token files.
    pattern = np.tile(np.arange(40) % 23, 200)
    write_prepared(root / "code", [pattern[:3000], pattern[3000:]])
    (root / "web").mkdir()
    for i in range(2):
        np.random.default_rng(i).integers(0, 256, 2500).astype(np.uint16).tofile(root / "web" / f"part{i}.bin")
    return {"code": str(root / "code"), "web": str(root / "web" / "part*.bin")}


def test_a_mixture_resumes_on_one_and_two_ranks_on_the_same_samples(run_root: Path, tmp_path: Path) -> None:
    paths = _sources(tmp_path)
    mixture = ["data=tokens", "model.vocab_size=257"]
    for name, weight in WEIGHTS.items():
        mixture += [f"data.sources.{name}.path={hq(paths[name])}", f"data.sources.{name}.weight={weight}"]
    common = [*mixture, f"trainer.max_steps={STEPS}", "trainer.log_every=1", f"trainer.global_batch_size={GLOBAL}",
              "trainer.micro_batch_size=4", "logger.backend=none", f"run.root={hq(run_root)}"]
    whole_trace, split_trace = tmp_path / "whole", tmp_path / "split"
    whole_trace.mkdir(), split_trace.mkdir()
    whole = launch(*common, "local.nproc=2", "run.name=whole", SLURMTRAIN_TRACE_SAMPLES=str(whole_trace))
    assert whole.returncode == 0, whole.stderr[-3000:]
    plan = whole.stdout + whole.stderr
    assert ("data: 192 samples of 65 tokens over the run: code 0.7 = 134 of its 124 (1.08 epochs); web 0.3 = 58 of "
            "its 78 (0.744 epochs)") in plan
    assert "warning: data.sources.code repeats: the run reads its 124 samples 1.08 times over" in plan

    split = [*common, "run.name=split"]
    for nproc, stop_at in ((2, 4), (1, 8)):
        stopped = launch(*split, f"local.nproc={nproc}", SLURMTRAIN_TEST_SIGNAL=f"{stop_at}:0",
                         SLURMTRAIN_TRACE_SAMPLES=str(split_trace))
        assert stopped.returncode == EXIT_STOPPED, stopped.stderr[-3000:]
    last = launch(*split, "local.nproc=2", SLURMTRAIN_TRACE_SAMPLES=str(split_trace))
    assert last.returncode == 0, last.stderr[-3000:]
    assert "resumed from" in last.stderr and "step 8," in last.stderr
    assert {p.name for p in split_trace.iterdir()} == {"rank0_world2.txt", "rank1_world2.txt", "rank0_world1.txt"}

    expected = {step: sorted(indices) for step, indices in traced_samples(whole_trace).items()}
    assert {step: sorted(indices) for step, indices in traced_samples(split_trace).items()} == expected
    assert sorted(expected) == list(range(1, STEPS + 1))

    reference, rows = read_metrics(run_root / "whole"), read_metrics(run_root / "split")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for a, b in zip(reference, rows, strict=True):
        assert (a["tokens_by_source"], a["epoch_by_source"]) == (b["tokens_by_source"], b["epoch_by_source"])
        if b["step"] <= 4:  # the first attempt, on the same 2 ranks: bitwise
            assert a["loss"] == b["loss"]
        else:  # after a resume on 1 rank the sums go in another order; other samples would move the loss far more
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
    final = rows[-1]
    assert sum(final["tokens_by_source"].values()) == final["tokens"] == STEPS * GLOBAL * 64
    for name, weight in WEIGHTS.items():
        assert abs(final["tokens_by_source"][name] / final["tokens"] - weight) <= 0.01
    assert final["epoch_by_source"] == {"code": pytest.approx(134 / 124, abs=1e-6), "web": pytest.approx(58 / 78)}

    reweighted = [a.replace("weight=0.3", "weight=0.5") for a in split]
    refused = launch(*reweighted, "local.nproc=2")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "holds a run with other training settings (data.sources.web.weight: 0.3 -> 0.5)" in refused.stderr
    allowed = launch(*reweighted, "local.nproc=2", "data.allow_changed=true", f"trainer.max_steps={STEPS + 1}",
                     "launcher.dry_run=true")
    assert allowed.returncode == 0 and "error" not in allowed.stderr, allowed.stderr[-3000:]
