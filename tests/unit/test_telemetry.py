"""The pure parts of training telemetry: the straggler rule, TFLOP/s and MFU arithmetic, per-node throughput,
the per-step timer (with a fake clock) and how rows reach the console and wandb."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from launcher.plan.estimate import flops_per_token
from train.observe import telemetry
from train.observe.metrics import telemetry_text, wandb_values
from train.observe.scalars import NODE_SHARES
from train.observe.telemetry import StepTimer, StragglerRule, interval_fields, peak_tflops, slow_rank_delay


def test_straggler_needs_the_factor_for_the_given_number_of_intervals_in_a_row() -> None:
    rule = StragglerRule(factor=1.5, intervals=3)
    slow = [1.0, 1.0, 1.0, 2.0]  # median 1.0: rank 3 is 2x
    assert rule.update(slow) == ([], 1.0)
    assert rule.update(slow) == ([], 1.0)
    assert rule.update(slow) == ([3], 1.0)
    assert rule.update(slow) == ([3], 1.0)  # still one while it lasts
    assert rule.update([1.0, 1.0, 1.0, 1.4]) == ([], 1.0)  # below 1.5x: the streak restarts
    assert rule.update(slow)[0] == [] and rule.update(slow)[0] == []
    assert rule.update(slow)[0] == [3]


def test_an_interrupted_streak_is_not_a_straggler() -> None:
    rule = StragglerRule(factor=1.5, intervals=2)
    for work in ([1.0, 3.0, 1.0], [1.0, 1.0, 1.0], [1.0, 3.0, 1.0]):
        assert rule.update(work)[0] == []
    assert rule.update([3.0, 1.0, 1.0])[0] == []  # another rank now: its own streak
    assert rule.update([3.0, 1.0, 1.0])[0] == [0]


def test_equal_ranks_one_rank_or_nothing_measured_give_no_straggler() -> None:
    rule = StragglerRule(factor=1.5, intervals=1)
    assert rule.update([0.2, 0.2])[0] == []
    assert rule.update([5.0])[0] == []
    assert rule.update([0.0, 0.0, 0.0])[0] == []
    # Two ranks: the median is their mean, so the slow one must be over 3x the other at factor 1.5.
    assert rule.update([1.0, 2.9])[0] == []
    assert rule.update([1.0, 3.1])[0] == [1]


def _rows() -> list[list[float]]:
    # wall_s, steps, compute_s, sync_s, data_s, peak_mem_bytes (sums over an interval of 4 steps)
    return [
        [2.0, 4, 1.6, 1.2, 0.2, 1 * 2**30],
        [2.0, 4, 1.6, 0.4, 0.4, 3 * 2**30],
        [1.6, 4, 1.2, 0.8, 0.0, 2 * 2**30],
    ]


def test_interval_fields_hand_computed() -> None:
    f = interval_fields(_rows(), ["n1", "n1", "n2"], tokens_per_rank_step=1000, flops_per_tok=3e9, peak=10.0)
    assert f["rank_step_time_s"] == pytest.approx([0.5, 0.5, 0.4])
    assert f["rank_data_wait_s"] == pytest.approx([0.05, 0.1, 0.0])
    assert f["rank_work_s"] == pytest.approx([0.1, 0.3, 0.1])
    assert f["step_time_s"] == pytest.approx(0.5) and f["data_wait_s"] == pytest.approx(0.1)
    assert f["data_wait_share"] == pytest.approx(0.2)
    # Per node: its ranks' share of the interval's tokens (4 steps x 1000 each), which the metrics row puts on its
    # own clock (MetricsLogger.log: tokens_per_s_by_node sums to tokens_per_s).
    assert f[NODE_SHARES] == pytest.approx({"n1": 2 / 3, "n2": 1 / 3})
    assert "tokens_per_s_by_node" not in f
    # TFLOP/s per device: the mean rank's tokens/s x FLOPs per token.
    assert f["tflops"] == pytest.approx((2000 + 2000 + 2500) / 3 * 3e9 / 1e12)
    assert f["mfu"] == pytest.approx(f["tflops"] / 10.0)
    assert f["rank_peak_mem_gib"] == pytest.approx([1.0, 3.0, 2.0]) and f["peak_mem_gib"] == pytest.approx(3.0)


def test_no_peak_no_mfu() -> None:
    assert "mfu" not in interval_fields(_rows(), ["a", "b", "c"], 1000, 3e9, peak=None)


def test_mfu_of_a_gpt2_step_by_hand() -> None:
    # GPT-2 124M, seq 1024: 6 x 85M matmul parameters (+ the 38.6M output layer) + attention 12 x 12 x 768 x 1024.
    model = OmegaConf.create({"d_model": 768, "n_layers": 12, "n_heads": 12, "n_kv_heads": None,
                              "ffn_hidden": 3072, "mlp": "gelu", "vocab_size": 50304})
    per_token = 6 * (12 * (4 * 768**2 + 2 * 768 * 3072) + 50304 * 768) + 12 * 12 * 768 * 1024
    assert flops_per_token(model, 1024) == per_token
    # One device doing 8 x 1024 tokens in 0.25 s at a 312 TFLOP/s peak.
    f = interval_fields([[1.0, 4, 1.0, 0.5, 0.0, 1.0]], ["h"], 8 * 1024, per_token, peak=312.0)
    assert f["tflops"] == pytest.approx(8 * 1024 / 0.25 * per_token / 1e12)
    assert f["mfu"] == pytest.approx(f["tflops"] / 312.0)


def test_peak_comes_from_the_cluster_for_the_precision_else_from_telemetry() -> None:
    def cfg(cluster: dict | None, peak: float | None) -> object:
        return OmegaConf.create({"cluster": cluster, "precision": {"name": "bf16"},
                                 "telemetry": {"peak_tflops": peak}})

    assert peak_tflops(cfg({"peak_tflops": {"bf16": 989.0, "fp32": 67.0}}, 5.0)) == 989.0
    assert peak_tflops(cfg({"peak_tflops": {}}, 5.0)) == 5.0  # a CPU cluster states none
    assert peak_tflops(cfg(None, 5.0)) == 5.0
    assert peak_tflops(cfg(None, None)) is None


def test_slow_rank_fault_injection_names_one_rank() -> None:
    env = {telemetry.TEST_SLOW_RANK_ENV: "1:0.25"}
    assert slow_rank_delay(1, env) == 0.25
    assert slow_rank_delay(0, env) == 0.0
    assert slow_rank_delay(1, {}) == 0.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_step_timer_splits_a_step_into_data_sync_and_work(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(telemetry.time, "perf_counter", clock)
    timer = StepTimer(torch.device("cpu"), enabled=True)
    for _ in range(2):
        timer.begin_step()
        for micro in range(2):
            with timer.data():
                clock.now += 0.01
            with timer.synchronised(micro == 1):  # accumulation 2: only the last micro step synchronises
                clock.now += 0.15  # forward and backward
        clock.now += 0.02  # optimizer step
        timer.end_step()
        clock.now += 0.03  # logging, stop agreement: in the wall time, not in the step's compute
    wall, steps, compute, sync, data = timer.drain()
    assert steps == 2
    assert wall == pytest.approx(2 * 0.37)
    assert compute == pytest.approx(2 * 0.34)
    assert sync == pytest.approx(2 * 0.15)
    assert data == pytest.approx(2 * 0.02)
    # The next interval starts where this one was drained.
    clock.now += 1.0
    assert timer.drain() == pytest.approx([1.0, 0.0, 0.0, 0.0, 0.0])


def test_disabled_timer_records_nothing() -> None:
    timer = StepTimer(torch.device("cpu"), enabled=False)
    timer.begin_step()
    with timer.data(), timer.synchronised(True):
        pass
    timer.end_step()
    assert timer.marks == [] and timer.data_s == 0.0


def test_console_and_wandb_views_of_a_row() -> None:
    row = {"step": 4, "time": 1.7e9, "loss": 2.0, "tokens_per_s": 100.0, "step_time_s": 0.05, "data_wait_share": 0.1,
           "tflops": 1.5, "mfu": 0.25, "peak_mem_gib": 2.0, "loss_scale": 1024.0,
           "tokens_per_s_by_node": {"n1": 60.0, "n2": 40.0}, "rank_work_s": [0.01, 0.03],
           "stragglers": [{"rank": 1, "host": "n2", "work_s": 0.03, "median_s": 0.02}]}
    text = telemetry_text(row)
    assert "50.0 ms" in text and "MFU 25.0%" in text and "loss scale 1024" in text and "ranks 1" in text
    assert telemetry_text({"step": 1, "loss": 1.0}) == ""
    w = wandb_values(row)
    assert w["tokens_per_s_by_node/n1"] == 60.0 and w["stragglers"] == 1 and w["mfu"] == 0.25
    assert "rank_work_s" not in w and "tokens_per_s_by_node" not in w
    assert "time" not in w and w["step"] == 4  # wandb stamps its rows itself
