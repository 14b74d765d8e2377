"""make gpu-check: the one command a lent GPU runs, in under 8 minutes.

1. the gpu test tier (tests/gpu), spread over 6 workers with pytest-xdist where it is installed, its log kept;
   DeepSpeed's strategies (zero*) are left out, and said so, where DeepSpeed is not installed;
2. the GPU arm of `python -m bench loop_overhead` (bench/loop_overhead_gpu.py: gpt2_124m mb8, gpt2_350m mb8 and
   mb16, llama3_1b mb8 in bf16 and fp8, compiled blocks: tokens/s, MFU and ours / bare against the bare loop on the
   same GPU, and host-device syncs per steady step), quick plan unless GPU_CHECK_FULL=1;
3. the memory estimate against `torch.cuda.max_memory_allocated` (the CUDA arm of bench/memory_estimate.py).

Each stage has a share of the 8 minutes (GPU_CHECK_TEST_S, default 210 s, for the tests; GPU_CHECK_BENCH_S, 270 s,
for the rows the loop_overhead arm starts), and gpu_check.json is written after every stage and every bench row, so
a run cut short keeps what it measured. A stage that raises is recorded with its error and the next one runs.

To run part of it again: GPU_CHECK_STAGES (a comma list of test_gpu, loop_overhead_gpu, memory_estimate_cuda) and
GPU_CHECK_CASES (a comma list of loop_overhead_gpu's rows, e.g. "gpt2_350m mb16,gpt2_124m mb8").

Everything goes to bench/results/gpu/DATE_DEVICE/ (gpu_check.json, test_gpu.log), DATE in UTC and DEVICE the GPU's
name, so figures from different cards and days never overwrite each other. Without CUDA it says so and exits 2.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.registry import RESULTS

ROOT = Path(__file__).resolve().parent.parent


def _out_dir(device: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H%MZ")
    slug = re.sub(r"[^A-Za-z0-9.-]+", "-", device).strip("-")
    path = RESULTS / "gpu" / f"{stamp}_{slug}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _test_gpu(out: Path, budget_s: float) -> dict[str, Any]:
    args = [sys.executable, "-m", "pytest", "tests/gpu", "-q", "-rA"]
    notes = []
    if _installed("xdist"):
        args += ["-n", "6"]
    if not _installed("deepspeed"):
        args += ["-k", "not zero"]
        notes.append("DeepSpeed is not installed: its strategies (zero1, zero2, zero3, zero3_offload) not run")
    t0 = time.perf_counter()
    with open(out / "test_gpu.log", "w") as log:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
            notes.append(f"stopped after its {budget_s:.0f} s share of make gpu-check")
    tail = (out / "test_gpu.log").read_text().strip().splitlines()[-1:] or [""]
    return {"returncode": rc, "summary": tail[0], "seconds": round(time.perf_counter() - t0, 1),
            "command": " ".join(args[1:]), "notes": notes}


def _loop_overhead_gpu(full: bool, budget_s: float, on_row: Any, cases: list[str] | None) -> dict[str, Any]:
    from bench import loop_overhead_gpu
    from bench.bare_loop import init_single_process
    from train import distributed

    env = init_single_process()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return loop_overhead_gpu.run_gpu(*loop_overhead_gpu.GPU_PLAN["full" if full else "quick"], env, Path(tmp),
                                             deadline=time.monotonic() + budget_s, on_row=on_row, cases=cases)
    finally:
        distributed.destroy_process_group()


def _stage(result: dict[str, Any], key: str, out: Path, run: Any) -> None:
    """result[key] = run(), or the error it raised; gpu_check.json written either way."""
    try:
        result[key] = run()
    except Exception as exc:  # a stage's failure is a figure too; the next stage still runs
        result[key] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
        print(f"{key}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2) + "\n")


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("error: make gpu-check needs a CUDA GPU (none visible); run it on a lent GPU machine", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name(0)
    out = _out_dir(device)
    full = os.environ.get("GPU_CHECK_FULL") == "1"
    result: dict[str, Any] = {"device": device, "torch": torch.__version__,
                              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                              "command": "make gpu-check"}
    stages = os.environ.get("GPU_CHECK_STAGES", "test_gpu,loop_overhead_gpu,memory_estimate_cuda").split(",")
    cases = [c.strip() for c in os.environ["GPU_CHECK_CASES"].split(",")] if os.environ.get("GPU_CHECK_CASES") else None
    result["stages"], result["cases"] = stages, cases
    if "test_gpu" in stages:
        _stage(result, "test_gpu", out, lambda: _test_gpu(out, float(os.environ.get("GPU_CHECK_TEST_S", "210"))))
        print(f"test-gpu: {result['test_gpu'].get('summary')}", flush=True)

    def row_done(partial: dict[str, Any]) -> None:
        result["loop_overhead_gpu"] = partial
        (out / "gpu_check.json").write_text(json.dumps(result, indent=2) + "\n")
        print(f"loop_overhead_gpu: {list(partial)[-1]} done", flush=True)

    if "loop_overhead_gpu" in stages:
        _stage(result, "loop_overhead_gpu", out,
               lambda: _loop_overhead_gpu(full, float(os.environ.get("GPU_CHECK_BENCH_S", "270")), row_done, cases))
    if "memory_estimate_cuda" in stages:
        from bench import memory_estimate

        _stage(result, "memory_estimate_cuda", out, lambda: memory_estimate.run_cuda(quick=not full))
    shown = ("loop_overhead_gpu", "memory_estimate_cuda")
    print(json.dumps({k: result[k] for k in shown if k in result}, indent=1)[:6000])
    print(f"wrote {out}")
    return 0 if result.get("test_gpu", {}).get("returncode", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
