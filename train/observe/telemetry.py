"""How well the run uses the hardware: step time per rank and its data wait, achieved TFLOP/s and MFU, peak
memory, per-node throughput, loss scale, stragglers; and the torch.profiler trace of `+profile=default`.

Between log steps every rank only takes timestamps (the host clock on CPU, CUDA events on a GPU): no host sync
and no collective. At a log step the ranks exchange their figures with one all_gather of a few floats, and rank 0
turns them into the row's fields and applies the straggler rule.

Why a "work" time besides the step time: in synchronous training every rank waits for the slowest one at the
next collective, so all ranks take the same wall time per step. Where a fast rank waits depends on the strategy:
in backward (the gradient all-reduce or reduce-scatter), in forward too (FSDP and ZeRO-3 gather parameters, DDP
broadcasts the model's buffers). So the pass that synchronises gradients, the forward and backward of the last
micro step, is timed apart, and a rank's work time is the rest of its step: loading data, the micro steps that
do not synchronise, the optimizer step, and whatever else slows that rank down. A straggler is a rank whose work
time stays above the median across ranks. What this cannot see is a rank slow only inside that pass: telling its
compute from its waiting there needs kernel-level timing.
"""

from __future__ import annotations

import contextlib
import os
import resource
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from contract.rules.flops import flops_per_token
from train.distributed import DistEnv, gather_hosts
from train.observe.metrics import log
from train.observe.scalars import NODE_SHARES

# Fault injection for tests: "RANK:SECONDS" makes RANK sleep that long in every step (a slow rank).
TEST_SLOW_RANK_ENV = "SLURMTRAIN_TEST_SLOW_RANK"
# Per-rank figures exchanged at a log step, in this order (sync_s: the synchronising forward and backward).
FIELDS = ("wall_s", "steps", "compute_s", "sync_s", "data_s", "peak_mem_bytes")
GIB = 2**30


def slow_rank_delay(rank: int, environ: dict[str, str] | None = None) -> float:
    spec = (os.environ if environ is None else environ).get(TEST_SLOW_RANK_ENV)
    if not spec:
        return 0.0
    slow_rank, seconds = spec.split(":")
    return float(seconds) if int(slow_rank) == rank else 0.0


# -- pure arithmetic (unit-tested) -------------------------------------------------------------------------------
def peak_tflops(cfg: Any) -> float | None:
    """Dense peak TFLOP/s of one device for the run's precision: the cluster's, else telemetry.peak_tflops. fp8: the
    mix of the cluster's fp8 and bf16 peaks the model's FLOPs run at (contract/rules/float8.py), as the plan counts."""
    if cfg.cluster is not None:
        from contract.rules.float8 import enabled
        from contract.rules.float8 import peak_tflops as precision_peak

        fp8 = enabled(cfg.precision)
        peak = precision_peak(cfg.precision, dict(cfg.cluster.peak_tflops), cfg.model if fp8 else None,
                              int(cfg.data.seq_len) if fp8 else 0)
        if peak is not None:
            return float(peak)
    return None if cfg.telemetry.peak_tflops is None else float(cfg.telemetry.peak_tflops)


def interval_fields(rows: list[list[float]], hosts: list[str], tokens_per_rank_step: float, flops_per_tok: float,
                    peak: float | None) -> dict[str, Any]:
    """The metrics row's telemetry fields from every rank's figures over one log interval (rows[rank] follows
    FIELDS; times are sums over the interval's steps)."""
    step_s, data_s, work_s, tok_s, mem_gib = [], [], [], [], []
    for wall, steps, compute, sync, data, mem in rows:
        n = max(steps, 1.0)
        step_s.append(wall / n)
        data_s.append(data / n)
        work_s.append(max(compute - sync, 0.0) / n)
        tok_s.append(steps * tokens_per_rank_step / wall if wall > 0 else 0.0)
        mem_gib.append(mem / GIB)
    # The tokens each node's ranks trained this interval, as shares of all of them: the metrics row turns them into
    # tokens/s on its own clock (MetricsLogger.log), so the nodes' figures sum to its tokens_per_s (one host: equal).
    by_node: dict[str, float] = defaultdict(float)
    for host, (_, steps, *_rest) in zip(hosts, rows, strict=True):
        by_node[host] += steps * tokens_per_rank_step
    trained = sum(by_node.values())
    tflops = statistics.fmean(tok_s) * flops_per_tok / 1e12
    step_time, data_wait = max(step_s), max(data_s)
    fields: dict[str, Any] = {
        "step_time_s": step_time,
        "data_wait_s": data_wait,
        "data_wait_share": data_wait / step_time if step_time > 0 else 0.0,
        "tflops": tflops,
    }
    if peak:
        fields["mfu"] = tflops / peak
    fields.update({
        "peak_mem_gib": max(mem_gib),
        NODE_SHARES: {host: n / trained if trained else 0.0 for host, n in by_node.items()},
        "rank_step_time_s": step_s,
        "rank_data_wait_s": data_s,
        "rank_work_s": work_s,
        "rank_peak_mem_gib": mem_gib,
    })
    return fields


class StragglerRule:
    """A rank is a straggler once its work time exceeded `factor` x the median across ranks for `intervals` log
    intervals in a row; it stays one while that holds."""

    def __init__(self, factor: float, intervals: int) -> None:
        self.factor, self.intervals = factor, max(1, intervals)
        self.streak: dict[int, int] = defaultdict(int)

    def update(self, work_s: list[float]) -> tuple[list[int], float]:
        """Feed one interval's per-rank work times; returns the stragglers and the median."""
        median = statistics.median(work_s)
        for rank, t in enumerate(work_s):
            slow = len(work_s) > 1 and median > 0 and t > self.factor * median
            self.streak[rank] = self.streak[rank] + 1 if slow else 0
        return [r for r in range(len(work_s)) if self.streak[r] >= self.intervals], median


# -- per-step timing ---------------------------------------------------------------------------------------------
class StepTimer:
    """Timestamps of each step's compute region (begin_step .. end_step) and of its synchronising pass, plus host
    time spent producing input. Nothing here waits for the device."""

    def __init__(self, device: torch.device, enabled: bool, slow_s: float = 0.0) -> None:
        self.enabled, self.slow_s = enabled, slow_s
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[Any, Any, Any, Any]] = []
        self.data_s = 0.0
        self.interval_start: float | None = None
        self._begin: Any = None
        self._sync: tuple[Any, Any] = (None, None)

    def _mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _seconds(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1000 if self.cuda else float(end - start)

    def begin_step(self) -> None:
        if self.enabled:
            if self.interval_start is None:
                self.interval_start = time.perf_counter()
            self._begin, self._sync = self._mark(), (None, None)
        if self.slow_s:
            time.sleep(self.slow_s)

    def end_step(self) -> None:
        if self.enabled:
            self.marks.append((self._begin, *self._sync, self._mark()))

    @contextlib.contextmanager
    def data(self) -> Iterator[None]:
        """Loading a micro batch and moving it to the device."""
        if not self.enabled:
            yield
            return
        t0 = time.perf_counter()
        yield
        self.data_s += time.perf_counter() - t0

    @contextlib.contextmanager
    def synchronised(self, is_sync_step: bool) -> Iterator[None]:
        """Forward and backward of the micro step that synchronises gradients (the last one)."""
        if not (self.enabled and is_sync_step):
            yield
            return
        start = self._mark()
        yield
        self._sync = (start, self._mark())

    def drain(self) -> list[float]:
        """This rank's figures since the last drain, in FIELDS order but for the memory figure."""
        now = time.perf_counter()
        wall = now - (self.interval_start if self.interval_start is not None else now)
        if self.cuda and self.marks:
            self.marks[-1][-1].synchronize()  # events complete; only called at a log step
        compute = sync = 0.0
        for begin, sync_start, sync_end, end in self.marks:
            compute += self._seconds(begin, end)
            if sync_start is not None:
                sync += self._seconds(sync_start, sync_end)
        out = [wall, float(len(self.marks)), compute, sync, self.data_s]
        self.marks, self.data_s, self.interval_start = [], 0.0, now
        return out


NO_TIMING = StepTimer(torch.device("cpu"), enabled=False)


def peak_memory_bytes(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    # ru_maxrss: kilobytes on Linux, bytes on macOS.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return float(rss if sys.platform == "darwin" else rss * 1024)


def all_gather_rows(values: list[float], device: torch.device) -> list[list[float]]:
    """Every rank's figures on every rank: one all_gather of a small float tensor."""
    local = torch.tensor(values, dtype=torch.float64, device=device)
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [local.tolist()]
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local)
    return torch.stack(parts).cpu().tolist()  # type: ignore[no-any-return]


# -- profiler ----------------------------------------------------------------------------------------------------
class StepProfiler:
    """`+profile=default`: torch.profiler with a wait / warmup / active schedule (steps counted from the start of
    this attempt) on the chosen ranks; Chrome traces in RUN_DIR/profile/, the top operators in the rank's log."""

    def __init__(self, cfg: Any, env: DistEnv, device: torch.device, run_dir: Path) -> None:
        self.prof: Any = None
        p = cfg.profile
        if p is None or env.rank not in p.ranks:
            return
        from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

        self.cfg, self.cuda, self.out, self.worker = p, device.type == "cuda", run_dir / "profile", f"rank{env.rank}"
        self.earlier = set(self._traces())  # an earlier attempt's, in a resumed run
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.prof = profile(
            activities=activities,
            schedule=schedule(wait=p.wait, warmup=p.warmup, active=p.active, repeat=p.repeat),
            on_trace_ready=tensorboard_trace_handler(str(self.out), worker_name=self.worker),
            acc_events=True,  # the top-operators table sums every active window (repeat > 1), not the last
        )
        self.prof.start()
        log.info("profiling steps %d-%d of this attempt (wait %d, warmup %d, active %d, repeat %d) into %s",
                 p.wait + p.warmup + 1, p.wait + p.warmup + p.active, p.wait, p.warmup, p.active, p.repeat, self.out)

    def _traces(self) -> list[Path]:
        return sorted(self.out.glob(f"{self.worker}.*.pt.trace.json"), key=lambda f: f.stat().st_mtime)

    def step(self) -> None:
        if self.prof is not None:
            self.prof.step()

    def close(self) -> None:
        if self.prof is None:
            return
        prof, self.prof = self.prof, None
        prof.stop()
        traces = [f for f in self._traces() if f not in self.earlier]
        if not traces:
            p = self.cfg
            log.warning("profiler recorded nothing: the attempt ended before its active window (wait %d + warmup "
                        "%d + active %d steps)", p.wait, p.warmup, p.active)
            return
        sort_by = "self_device_time_total" if self.cuda else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=sort_by, row_limit=self.cfg.top_ops)
        log.info("profiler trace %s; top %d operators by %s:\n%s", traces[-1], self.cfg.top_ops, sort_by, table)


# -- what the loop calls -----------------------------------------------------------------------------------------
@dataclass
class Straggler:
    rank: int
    host: str
    work_s: float
    median_s: float


class Telemetry:
    """The loop's one handle: begin_step/end_step around each step, `timer` inside it, collect() at log steps
    (a collective: every rank calls it), close() at the end."""

    def __init__(self, cfg: Any, env: DistEnv, device: torch.device, run_dir: Path,
                 hosts: list[str] | None = None, model_flops_per_token: float | None = None,
                 devices_per_replica: int = 1) -> None:
        t = cfg.telemetry
        self.env, self.device, self.enabled = env, device, bool(t.enabled)
        self.timer = StepTimer(device, self.enabled, slow_rank_delay(env.rank))
        self.profiler = StepProfiler(cfg, env, device, run_dir)
        self.fp16 = cfg.precision.compute_dtype == "float16"
        if not self.enabled:
            return
        self.hosts = hosts or gather_hosts(env)
        tr = cfg.trainer
        # A rank's share of its replica's tokens: the ranks of one replica (tp x pp x cp) work on the same sequences,
        # and each counting them whole made the TFLOP/s and MFU of a device, and a node's tokens/s, that many times
        # too high.
        self.tokens_per_rank_step = tr.micro_batch_size * tr.grad_accum_steps * cfg.data.seq_len / devices_per_replica
        self.flops_per_token = model_flops_per_token or flops_per_token(cfg.model, cfg.data.seq_len)
        self.peak = peak_tflops(cfg)
        self.rule = StragglerRule(t.straggler_factor, t.straggler_intervals)

    def begin_step(self) -> None:
        self.timer.begin_step()

    def end_step(self) -> None:
        self.timer.end_step()
        self.profiler.step()

    def collect(self, step: int, strategy: Any) -> dict[str, Any]:
        """Telemetry fields for the metrics row of this log step (on rank 0; empty elsewhere)."""
        if not self.enabled:
            return {}
        rows = all_gather_rows([*self.timer.drain(), peak_memory_bytes(self.device)], self.device)
        if not self.env.is_main:
            return {}
        fields = interval_fields(rows, self.hosts, self.tokens_per_rank_step, self.flops_per_token, self.peak)
        if self.fp16:
            scale = strategy.loss_scale()
            if scale is not None:
                fields["loss_scale"] = scale
        flagged, median = self.rule.update(fields["rank_work_s"])
        stragglers = [Straggler(r, self.hosts[r], fields["rank_work_s"][r], median) for r in flagged]
        for s in stragglers:
            log.warning("step %d: straggler: rank %d on %s works %.4f s per step outside the synchronising pass, "
                        "%.1fx the median %.4f s, for %d log intervals in a row (telemetry.straggler_factor=%g)",
                        step, s.rank, s.host, s.work_s, s.work_s / median, median, self.rule.streak[s.rank],
                        self.rule.factor)
        fields["stragglers"] = [asdict(s) for s in stragglers]
        return fields

    def close(self) -> None:
        self.profiler.close()
