"""The Validator reads each set once and keeps its batches (train/evaluation/set_batches.py): a later pass reads
nothing and gives bitwise the same losses; a set too large to keep is read again every pass, said once; a set with
fewer samples than a pass reads is named at the first pass, with its size, the pass's and the fix."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from launcher.compose import compose_and_plan
from train.evaluation.validator import Validator
from train.model.build import build_model

GLOBAL_BATCH, BATCHES, SEQ = 8, 2, 16
COMMON = ["run.root=/tmp/x", "model.d_model=32", "model.n_layers=1", "model.ffn_hidden=64", f"data.seq_len={SEQ}",
          "trainer.micro_batch_size=4", f"trainer.global_batch_size={GLOBAL_BATCH}", "eval.every=2",
          f"eval.batches={BATCHES}"]


class CountingSource:
    """A set's source that counts the samples read from it."""

    def __init__(self, source: Any) -> None:
        self.source, self.read = source, 0
        for attr in ("windows", "size"):
            if hasattr(source, attr):
                setattr(self, attr, getattr(source, attr))

    def sample(self, index: int) -> Any:
        self.read += 1
        return self.source.sample(index)

    def sample_batch(self, indices: Any) -> Any:
        self.read += len(indices)
        return self.source.sample_batch(indices)


def _validator(overrides: list[str]) -> tuple[Validator, torch.nn.Module]:
    cfg, _ = compose_and_plan([*COMMON, *overrides])
    torch.manual_seed(0)
    strategy = SimpleNamespace(dp_rank=0, dp_size=1, pipeline=None, env=SimpleNamespace(is_main=True),
                               autocast=contextlib.nullcontext, split_sequence=lambda *t: t)
    validator = Validator(cfg, strategy, torch.device("cpu"))
    for name, source in validator.sets.items():
        validator.sets[name] = CountingSource(source)
    return validator, build_model(cfg.model)


def _token_file(path: Path, tokens: int) -> Path:
    np.random.default_rng(0).integers(0, 256, tokens, dtype=np.uint16).tofile(path)
    return path


def test_a_later_pass_reads_nothing_and_gives_bitwise_the_same_losses(tmp_path: Path) -> None:
    big = _token_file(tmp_path / "big.bin", 40 * SEQ + 1)
    validator, model = _validator(["eval.sets.held.kind=synthetic", "eval.sets.file.kind=tokens",
                                   f"eval.sets.file.path={big}"])
    first = validator.run(model)
    read = {name: source.read for name, source in validator.sets.items()}
    assert read == {"held": BATCHES * GLOBAL_BATCH, "file": BATCHES * GLOBAL_BATCH}
    second = validator.run(model)
    assert {name: source.read for name, source in validator.sets.items()} == read  # nothing read again
    assert second == first and set(first) == {"val/held/loss", "val/held/ppl", "val/file/loss", "val/file/ppl"}


def test_a_set_too_large_to_keep_is_read_every_pass_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    validator, model = _validator([])
    validator.set_batches.limit = 1024  # bytes: a pass's 16 samples take 4 KiB
    with caplog.at_level(logging.INFO, logger="slurmtrain"):
        first = validator.run(model)
        second = validator.run(model)
    assert validator.sets["val"].read == 2 * BATCHES * GLOBAL_BATCH
    assert second == first
    notes = [r.getMessage() for r in caplog.records if "again at every pass" in r.getMessage()]
    assert notes == ["validation reads val (4 KiB) again at every pass: keeping them would take more than 1 KiB of "
                     "memory per rank (kept: 0 KiB); fewer eval.batches make them fit"]


def test_a_set_smaller_than_a_pass_is_named_once_with_its_size_and_the_fix(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    small = _token_file(tmp_path / "small.bin", 11 * SEQ + 1)  # 11 windows: a pass reads 16
    tiny = _token_file(tmp_path / "tiny.bin", 5 * SEQ + 1)  # 5: not even one batch
    enough = _token_file(tmp_path / "enough.bin", 16 * SEQ + 1)
    validator, model = _validator([f"eval.sets.small.path={small}", "eval.sets.small.kind=tokens",
                                   f"eval.sets.tiny.path={tiny}", "eval.sets.tiny.kind=tokens",
                                   f"eval.sets.enough.path={enough}", "eval.sets.enough.kind=tokens",
                                   "eval.sets.held.kind=synthetic"])
    with caplog.at_level(logging.WARNING, logger="slurmtrain"):
        validator.run(model)
        validator.run(model)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "validation set small holds 11 samples and a pass reads 16 (eval.batches=2 x the global batch 8): it reads "
        "some samples more than once, and they weigh more in its loss; set eval.batches=1 (8 samples) or give the "
        "set at least 16 samples",
        "validation set tiny holds 5 samples and a pass reads 16 (eval.batches=2 x the global batch 8): it reads "
        "some samples more than once, and they weigh more in its loss; give the set at least 8 samples (one batch) "
        "and 16 for eval.batches=2",
    ]
