"""Rank-tagged logging, metrics.jsonl, wandb, TensorBoard (train/observe/tensorboard_log.py) and the rank-0
progress bar."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from contract.rules.log_backends import backends
from contract.rundir import env_faults, metrics_file
from train.distributed import DistEnv
from train.observe.scalars import NODE_SHARES, wandb_values

log = logging.getLogger("slurmtrain")


def setup_logging(env: DistEnv) -> None:
    """Every line carries the rank and node; a file handler is added when the launcher asks for one."""
    fmt = logging.Formatter(f"%(asctime)s {env.tag()} %(message)s", datefmt="%H:%M:%S")
    # A log line that can't be written (a full disk, a vanished run directory) is dropped, not answered with a
    # traceback on the terminal: the failure itself ends the rank in one line (contract/rundir/environment.py).
    logging.raiseExceptions = False
    log.handlers.clear()
    log.setLevel(logging.INFO)
    log.propagate = False
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(fmt)
    log.addHandler(stream)
    log_file = os.environ.get("SLURMTRAIN_LOG_FILE")
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(log_file)
        handler.setFormatter(fmt)
        log.addHandler(handler)


class MetricsLogger:
    """Rank 0 writes; other ranks hold a no-op instance so the loop needs no rank checks."""

    def __init__(self, cfg: Any, env: DistEnv, run_dir: Path, max_steps: int) -> None:
        self.enabled = env.is_main
        self.rank = env.rank
        self.max_steps = max_steps
        self.path = run_dir / metrics_file.FILE_NAME
        self.wandb_run: Any = None
        self.tensorboard: Any = None
        self.progress: Any = None
        self._last_time = time.perf_counter()
        self._last_tokens = 0
        self.cfg, self.run_dir = cfg, run_dir

    def start(self, step: int, tokens: int, wandb_id: str | None, config: dict[str, Any]) -> None:
        self._last_time, self._last_tokens = time.perf_counter(), tokens
        if not self.enabled:
            return
        # Also at step 0: an attempt that died before its first checkpoint left rows that are redone now.
        self._drop_rows_after(step)
        chosen = backends(self.cfg.logger.backend)
        if "wandb" in chosen:
            self.wandb_run = _init_wandb(self.cfg, self.run_dir, wandb_id, config)
        if "tensorboard" in chosen:
            from train.observe.tensorboard_log import TensorBoardLog

            self.tensorboard = TensorBoardLog(self.run_dir, step)
        if self.cfg.trainer.progress_bar and sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                TimeRemainingColumn(),
                transient=False,
            )
            self.progress.start()
            # rich now proxies sys.stderr so log lines print above the bar instead of through it.
            self._reroute_stream_handlers(sys.stderr)
            self._task = self.progress.add_task("", total=self.max_steps, completed=step)

    def rewind(self, step: int, tokens: int) -> None:
        """After an in-process rollback to `step` (train/stability): its later rows are redone, as on a resume."""
        self._last_time, self._last_tokens = time.perf_counter(), tokens
        if self.enabled:
            self._drop_rows_after(step)
            if self.tensorboard is not None:
                self.tensorboard.restart(step)

    def _drop_rows_after(self, step: int) -> None:
        """On resume, rows past the checkpoint were logged by an attempt whose later steps are redone."""
        if not self.path.is_file():
            return
        kept = [line for line in self.path.read_text().splitlines() if _row_step(line) <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(self.path)

    @property
    def wandb_id(self) -> str | None:
        return None if self.wandb_run is None else self.wandb_run.id

    def tick(self, step: int, loss: float | None) -> None:
        env_faults.after_step(step, self.rank, self.run_dir)  # tests only: nothing unless asked for
        if self.progress is not None:
            desc = "" if loss is None else f"loss {loss:.4f}"
            self.progress.update(self._task, completed=step, description=desc)

    def log(self, step: int, tokens: int, telemetry: dict[str, Any] | None = None, **values: float) -> dict[str, Any]:
        now = time.perf_counter()
        elapsed = max(now - self._last_time, 1e-9)
        # `time` (epoch seconds, when the step's row is written): when a step completed, e.g. a resume's first one.
        rate = (tokens - self._last_tokens) / elapsed
        fields = dict(telemetry or {})
        shares = fields.pop(NODE_SHARES, None)
        if shares is not None:  # each node's share of the tokens, at the row's rate: one clock for both figures
            fields["tokens_per_s_by_node"] = {host: share * rate for host, share in shares.items()}
        row = {"step": step, "time": time.time(), **values, "tokens_per_s": rate, "tokens": tokens, **fields}
        self._last_time, self._last_tokens = now, tokens
        return self._write(row)

    def log_validation(self, step: int, tokens: int, values: dict[str, float]) -> dict[str, Any]:
        """A row of validation alone (step 0 with eval.at_start): no training step ran, so it has no loss and no
        throughput figure (a tokens_per_s of 0 would read as a stall); the next row's throughput starts here."""
        self._last_time, self._last_tokens = time.perf_counter(), tokens
        return self._write({"step": step, "time": time.time(), **values, "tokens": tokens})

    def _write(self, row: dict[str, Any]) -> dict[str, Any]:
        step = row["step"]
        if not self.enabled:
            return row
        env_faults.disk_full("metrics", step, self.path)  # tests only
        with self.path.open("a") as f:
            f.write(metrics_file.encode_row(row) + "\n")  # strict JSON: a non-finite value is written as text
        if self.wandb_run is not None:
            self.wandb_run.log(wandb_values(row), step=step)
        if self.tensorboard is not None:
            self.tensorboard.log(row)
        if self.progress is None and "loss" in row:  # a validation row of its own has no training loss
            log.info(
                "step %d/%d loss %.4f lr %.3g tok/s %.0f%s",
                step, self.max_steps, row["loss"], row["lr"], row["tokens_per_s"], telemetry_text(row),
            )
        return row

    def exclude(self, seconds: float) -> None:
        """Leave these seconds (a validation pass) out of the next row's tokens_per_s."""
        self._last_time += seconds

    def _reroute_stream_handlers(self, stream: Any) -> None:
        for handler in log.handlers:
            if type(handler) is logging.StreamHandler:
                handler.setStream(stream)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self._reroute_stream_handlers(sys.stderr)
        if self.wandb_run is not None:
            self.wandb_run.finish()
        if self.tensorboard is not None:
            self.tensorboard.close()


class IntervalLoss:
    """metrics.jsonl's `loss_avg`: the mean of the step losses since the previous logged row, summed on the device
    (no host sync per step) and, at a log step, averaged over the ranks in the one all-reduce that averages the
    step's own `loss`. Less noisy than the step's single batch: a sweep ranks points by it when they have no
    validation loss (launcher/observe/ranking.py). A checkpoint carries the interval so far (TrainState.loss_sum,
    loss_steps: `carry` before a save), and a run resumed from it, or rolled back to it, starts from there."""

    def __init__(self, carried_sum: float = 0.0, carried_steps: int = 0) -> None:
        self.total: Any = None
        self.carried, self.steps = carried_sum, carried_steps

    def add(self, loss: Any) -> None:
        loss = loss.detach()
        if self.total is None:
            self.total = loss + self.carried if self.steps else loss
        else:
            self.total = self.total + loss
        self.steps += 1

    def reset(self) -> None:
        self.total, self.carried, self.steps = None, 0.0, 0

    def take(self, loss: Any) -> tuple[float, float]:
        """The step's loss and the interval's mean, each averaged over the ranks; the next interval starts."""
        import torch

        from train.distributed import all_reduce_mean

        mean = loss.detach() if self.total is None else self.total / self.steps
        both = all_reduce_mean(torch.stack([loss.detach().float(), mean.float()]))
        self.reset()
        return float(both[0]), float(both[1])

    def carry(self, state: Any) -> None:
        """Into `state` (a TrainState), before a save: the interval so far, averaged over the ranks (an all-reduce
        when a step was added since the last row or the resume: every rank saves at the same step)."""
        if self.total is None:
            state.loss_sum, state.loss_steps = self.carried, self.steps
            return
        from train.distributed import all_reduce_mean

        state.loss_sum, state.loss_steps = float(all_reduce_mean(self.total.float())), self.steps


def telemetry_text(row: dict[str, Any]) -> str:
    """The console's summary of the telemetry fields (train/observe/telemetry.py), when the row has them."""
    if "step_time_s" not in row:
        return ""
    text = (f" | step {row['step_time_s'] * 1000:.1f} ms (data {row['data_wait_share']:.1%}) "
            f"{row['tflops']:.3g} TFLOP/s/device")
    if "mfu" in row:
        text += f" MFU {row['mfu']:.1%}"
    text += f" | peak mem {row['peak_mem_gib']:.2f} GiB"
    if "loss_scale" in row:
        text += f" | loss scale {row['loss_scale']:g}"
    if row.get("stragglers"):
        text += " | stragglers: ranks " + ", ".join(str(s["rank"]) for s in row["stragglers"])
    return text


def _row_step(line: str) -> float:
    """The step of a metrics row; a torn last line (the writer was killed mid-write) sorts after everything."""
    try:
        return float(metrics_file.decode_row(line)["step"])
    except (ValueError, KeyError, TypeError):
        return float("inf")


def _init_wandb(cfg: Any, run_dir: Path, run_id: str | None, config: dict[str, Any]) -> Any:
    import wandb

    return wandb.init(
        project=cfg.logger.project,
        entity=cfg.logger.entity,
        mode=cfg.logger.mode,
        dir=str(run_dir),
        name=cfg.run.name,
        group=cfg.logger.group,
        id=run_id,
        # A requeued or re-run job continues the same curve.
        resume="allow",
        config=config,
    )
