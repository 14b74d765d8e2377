"""train/observe/sync_count.py: what the guard of tests/dist/test_sync_free.py counts as a host read, per step."""

from __future__ import annotations

import pytest
import torch

from train.observe import sync_count
from train.observe.sync_count import SyncCounter, host_values


def test_every_kind_of_read_is_counted_in_its_step_and_busy_steps_are_not_steady() -> None:
    t = torch.tensor([0.0, 2.0])
    with SyncCounter() as counter:
        sync_count.step_begins(1)
        t.sum().item()  # a busy step's read: counted, but not steady
        sync_count.busy("log")
        sync_count.step_begins(2)
        float(t[1])
        bool(t[0])
        t.tolist()
        t.nonzero()
        t.cpu()
        t.to("cpu")  # onto the device it is on, outside train/: what a library's .to(device) looks like on a CPU
        t.to("cpu", non_blocking=True)  # not blocking: not a read
        t.numpy()
        sync_count.step_begins(3)
        (t * 2).add_(1)  # device work only
    assert counter.steady_steps() == [2, 3]
    kinds = [r.kind for r in counter.steady_reads()]
    assert kinds == ["_local_scalar_dense", "_local_scalar_dense", "tolist", "nonzero", "cpu", "numpy"]
    assert {r.step for r in counter.steady_reads()} == {2}
    assert counter.per_steady_step() == pytest.approx(6 / 2)
    assert "1 per step: _local_scalar_dense" in counter.report()
    assert [r.step for r in counter.reads if r.step == 1] == [1]


def test_host_values_reads_host_tensors_uncounted_and_refuses_device_ones() -> None:
    with SyncCounter() as counter:
        sync_count.step_begins(1)
        assert host_values(torch.tensor([3, 1], dtype=torch.int32)) == [3, 1]
        with pytest.raises(ValueError, match="host tensors only"):
            host_values(torch.empty(2, device="meta"))
    assert counter.reads == []


def test_without_a_counter_the_loop_hooks_do_nothing() -> None:
    sync_count.step_begins(5)
    sync_count.busy("log")
    assert host_values(torch.tensor([1.0])) == [1.0]


def test_a_cuda_mode_other_than_count_or_error_is_refused() -> None:
    with pytest.raises(ValueError, match="'count' or 'error'"):
        SyncCounter(cuda="warn")
