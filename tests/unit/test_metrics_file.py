"""metrics.jsonl is strict JSON when values are not finite, and every reader of the file gets the floats back."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from contract.rundir import metrics_file
from launcher.observe import run_rows
from launcher.sweeps import summary
from tests import conftest
from tests.slurm import helpers
from train.distributed import DistEnv
from train.observe.metrics import MetricsLogger

NAN, INF = math.nan, math.inf


def strict_loads(line: str) -> Any:
    """json.loads as a strict parser (jq, JavaScript, Go) would: no NaN, Infinity or -Infinity tokens."""
    def refuse(token: str) -> Any:
        raise ValueError(f"not JSON: {token}")

    return json.loads(line, parse_constant=refuse)


def same(a: Any, b: Any) -> bool:
    """Equality where nan equals nan (and the types match: a float stays a float)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


DIVERGED_TELEMETRY = {
    "step_time_s": 0.02, "data_wait_s": NAN, "data_wait_share": NAN, "tflops": INF, "mfu": -INF,
    "peak_mem_gib": 0.3, "tokens_per_s_by_node": {"n1": INF, "nan": 5.0},
    "rank_step_time_s": [0.02, NAN], "rank_work_s": [INF, -INF], "loss_scale": INF,
    "stragglers": [{"rank": 1, "host": "inf", "work_s": NAN, "median_s": 0.01}],
}


def test_every_non_finite_value_round_trips_as_strict_json() -> None:
    row = {"step": 3, "time": 1.5, "loss": NAN, "lr": INF, "grad_norm": -INF, "tokens_per_s": 10.0, "tokens": 96,
           **DIVERGED_TELEMETRY}
    line = metrics_file.encode_row(row)
    raw = strict_loads(line)
    assert raw["loss"] == "nan" and raw["lr"] == "inf" and raw["grad_norm"] == "-inf"
    assert raw["rank_step_time_s"] == [0.02, "nan"] and raw["tokens_per_s_by_node"] == {"n1": "inf", "nan": 5.0}
    assert same(metrics_file.decode_row(line), row)  # a host named "inf" stays text, a host key stays a key


def test_old_files_with_bare_nan_tokens_still_read(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": NaN, "lr": Infinity}\n'
                                            '{"step": 3, "lo')
    rows = metrics_file.read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2] and math.isnan(rows[1]["loss"]) and rows[1]["lr"] == INF


def test_nonfinite_since_is_the_start_of_the_trailing_streak() -> None:
    rows = [{"step": s, "loss": v} for s, v in [(1, 3.0), (2, NAN), (3, 2.0), (4, INF), (5, NAN)]]
    assert metrics_file.nonfinite_since(rows, "loss") == {"step": 4, "loss": INF}
    assert metrics_file.nonfinite_since(rows[:4], "loss") == {"step": 4, "loss": INF}
    assert metrics_file.nonfinite_since(rows[:3], "loss") is None
    assert metrics_file.nonfinite_since([], "loss") is None


class FakeWandbRun:
    def __init__(self) -> None:
        self.logged: list[dict[str, Any]] = []

    def log(self, values: dict[str, Any], step: int) -> None:
        self.logged.append(values)


def metrics_logger(run_dir: Path) -> MetricsLogger:
    cfg = SimpleNamespace(logger=SimpleNamespace(backend="none"), trainer=SimpleNamespace(progress_bar=False))
    env = DistEnv(rank=0, local_rank=0, world_size=1, local_world_size=1, master_addr="localhost", master_port=0,
                  launcher="single", node="n1")
    return MetricsLogger(cfg, env, run_dir, max_steps=30)


def test_the_writer_writes_strict_json_and_wandb_gets_floats(tmp_path: Path) -> None:
    logger = metrics_logger(tmp_path)
    logger.start(0, 0, None, {})
    logger.wandb_run = FakeWandbRun()
    logger.log(1, 32, None, loss=5.5, lr=1e6, grad_norm=0.8)
    logger.log(2, 64, dict(DIVERGED_TELEMETRY), loss=NAN, lr=INF, grad_norm=NAN)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [strict_loads(line)["loss"] for line in lines] == [5.5, "nan"]
    assert strict_loads(lines[1])["rank_work_s"] == ["inf", "-inf"]
    [_, diverged] = logger.wandb_run.logged
    assert math.isnan(diverged["loss"]) and diverged["lr"] == INF and diverged["tflops"] == INF
    # A resume keeps the rows up to its checkpoint, non-finite ones included, and drops the rest.
    logger.start(2, 64, None, {})
    assert [r["step"] for r in metrics_file.read_metrics(tmp_path)] == [1, 2]
    logger.start(1, 32, None, {})
    assert [r["step"] for r in metrics_file.read_metrics(tmp_path)] == [1]


def test_a_validation_row_of_its_own_has_no_throughput(tmp_path: Path) -> None:
    """Step 0 with eval.at_start: no training step ran, so neither metrics.jsonl nor wandb gets a tokens_per_s (a 0
    there read as a stall at step 0)."""
    logger = metrics_logger(tmp_path)
    logger.start(0, 0, None, {})
    logger.wandb_run = FakeWandbRun()
    logger.log_validation(0, 0, {"val/val/loss": 5.5, "val/val/ppl": 244.7})
    logger.log(1, 32, None, loss=5.4, lr=1e-3, grad_norm=0.8)
    step0, step1 = metrics_file.read_metrics(tmp_path)
    assert set(step0) == {"step", "time", "val/val/loss", "val/val/ppl", "tokens"} and step0["tokens"] == 0
    assert step1["tokens_per_s"] > 0 and metrics_file.training_rows([step0, step1]) == [step1]
    assert "tokens_per_s" not in logger.wandb_run.logged[0] and "tokens_per_s" in logger.wandb_run.logged[1]


@pytest.fixture
def diverged_run(tmp_path: Path) -> Path:
    rows = [{"step": 1, "loss": 5.5, "lr": 1e6, "grad_norm": 0.8, "tokens_per_s": 100.0, "tokens": 32},
            {"step": 2, "loss": NAN, "lr": INF, "grad_norm": NAN, "tokens_per_s": 100.0, "tokens": 64,
             **DIVERGED_TELEMETRY}]
    (tmp_path / "metrics.jsonl").write_text("".join(metrics_file.encode_row(r) + "\n" for r in rows))
    return tmp_path


def test_every_reader_gets_the_non_finite_floats(diverged_run: Path) -> None:
    for rows in (run_rows.read_metrics(diverged_run), conftest.read_metrics(diverged_run)):
        assert [r["step"] for r in rows] == [1, 2]
        assert math.isnan(rows[1]["loss"]) and rows[1]["lr"] == INF and math.isnan(rows[1]["rank_step_time_s"][1])
    last = summary.last_row(diverged_run)
    assert last["step"] == 2 and math.isnan(last["loss"])
    assert helpers.logged_steps(diverged_run) == 2

