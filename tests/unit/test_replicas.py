"""Replica consistency's parts (issue 22): the fingerprint is exact (any single flipped bit, in any tensor and dtype,
changes it; equal tensors give equal ones, however laid out or chunked), the vote names the rank outside a strict
majority or, with none, every rank of the split; checkpoint markers and launcher.status carry the verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from contract.rundir import ckpt_layout as layout
from contract.rundir.events import corruption_notes
from train.stability import fingerprint as fp
from train.stability.replicas import judge

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.int8,
          torch.uint8, torch.bool]


def _tensor(dtype: torch.dtype, n: int = 257) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(n, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g) * 3).to(dtype)
    return torch.randint(-100 if dtype.is_signed else 0, 100, (n,), generator=g, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_single_flipped_bit_changes_the_fingerprint(dtype: torch.dtype) -> None:
    t = _tensor(dtype, 5)
    before = fp.fingerprint([torch.zeros(3), t])
    raw = t.view(torch.uint8) if dtype == torch.bool else t
    as_bytes = raw.contiguous().view(torch.uint8)
    for i in range(as_bytes.numel()):
        for bit in range(8):
            flipped = as_bytes.clone()
            flipped[i] ^= 1 << bit
            other = flipped.view(raw.dtype).view(torch.bool) if dtype == torch.bool else flipped.view(dtype)
            after = fp.fingerprint([torch.zeros(3), other])
            assert after[:2] == before[:2] and after[2] != before[2], (i, bit)  # the plain sum, exactly


def test_equal_tensors_give_equal_fingerprints_however_laid_out_or_chunked(monkeypatch: pytest.MonkeyPatch) -> None:
    t = torch.randn(300, 129)
    same = t.t().contiguous().t()  # equal values, another memory layout
    assert not same.is_contiguous()
    expected = fp.fingerprint([t, t.bfloat16()])
    assert fp.fingerprint([same.clone(), t.bfloat16().clone()]) == expected
    assert fp.fingerprint([same, t.bfloat16()]) == expected
    monkeypatch.setattr(fp, "ROW", 64)
    whole = fp.fingerprint([t, t.bfloat16()])
    monkeypatch.setattr(fp, "CHUNK", 640)  # many pieces (whole rows each, as CHUNK is): the same integers
    assert fp.fingerprint([t, t.bfloat16()]) == whole
    assert whole[0::2] == expected[0::2]  # the plain sums don't depend on the rows at all
    assert fp.fingerprint([]) == []
    assert fp.fingerprint([torch.empty(0)]) == [0, 0]


def test_a_swap_of_two_elements_shows_in_the_weighted_sum() -> None:
    t = torch.arange(10, dtype=torch.float32)
    swapped = t.clone()
    swapped[[2, 7]] = swapped[[7, 2]]
    a, b = fp.fingerprint([t]), fp.fingerprint([swapped])
    assert a[0] == b[0] and a[1] != b[1]


def test_the_sums_do_not_overflow_at_the_extremes() -> None:
    """Every word at its most negative value, a whole chunk: the sums are the exact integers."""
    n = 3 * fp.ROW + 5
    w = torch.full((n,), -(2**31), dtype=torch.int32)
    plain, weighted = fp.fingerprint([w])
    assert plain == -(2**31) * n
    rows = [sum(-(2**31) * (j + 1) for j in range(min(fp.ROW, n - r))) % fp.PRIME for r in range(0, n, fp.ROW)]
    assert weighted == sum(rows)


NAMES = [["a", "b"]] * 4


def test_the_rank_outside_a_strict_majority_is_named_with_the_tensor_that_differs() -> None:
    good, bad = [1, 2, 3, 4], [1, 2, 3, 5]
    found = judge(8, [()] * 3, [good, bad, good], NAMES[:3])
    assert found is not None and found.bad == [1] and found.suspects == [] and found.majority == {1: [0, 2]}
    assert found.tensors == ["b"] and found.step == 8
    assert judge(8, [()] * 3, [good, good, good], NAMES[:3]) is None


def test_two_replicas_that_disagree_are_both_suspects() -> None:
    found = judge(4, [()] * 2, [[1, 2, 3, 4], [9, 2, 3, 4]], NAMES[:2])
    assert found is not None and found.bad == [] and found.suspects == [0, 1] and found.tensors == ["a"]
    assert found.named == [0, 1]


def test_only_ranks_with_the_same_key_are_compared() -> None:
    """Two pipeline stages of two replicas each: the stages hold different tensors and never outvote each other."""
    keys = [(0, 0), (1, 0), (0, 0), (1, 0)]
    stage0, stage1 = [1, 1, 2, 2], [7, 7, 8, 8]
    assert judge(2, keys, [stage0, stage1, stage0, stage1], NAMES) is None
    found = judge(2, keys, [stage0, stage1, stage0, [7, 7, 8, 9]], NAMES)
    assert found is not None and found.suspects == [1, 3] and found.bad == []


def test_a_checkpoint_marker_says_whether_it_was_verified(tmp_path: Path) -> None:
    for step, info in ((2, {"verified": True}), (4, {"verified": False}), (6, {})):
        path = layout.step_dir(tmp_path, step)
        path.mkdir(parents=True)
        layout.write_marker(path, step=step, **info)
    (layout.step_dir(tmp_path, 8)).mkdir()
    (layout.step_dir(tmp_path, 8) / layout.MARKER).write_text("{torn")
    assert [c.step for c in layout.list_checkpoints(tmp_path) if layout.verified(c)] == [2]
    assert json.loads((layout.step_dir(tmp_path, 2) / layout.MARKER).read_text())["verified"] is True


def test_status_notes_name_the_ranks_and_hosts() -> None:
    events = [{"kind": "corruption", "step": 6, "ranks": [1], "suspects": [], "hosts": ["n2"]},
              {"kind": "rollback", "step": 6},
              {"kind": "corruption", "step": 9, "ranks": [], "suspects": [0, 1], "hosts": ["n1", "n2"]}]
    assert corruption_notes(events) == [
        "silent data corruption at step 6: rank 1 (n2) outside the replicas' majority",
        "silent data corruption at step 9: rank 0 (n1), rank 1 (n2) disagreeing, no majority"]
