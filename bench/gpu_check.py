"""make gpu-check: the one command a lent GPU runs, in under 8 minutes.

1. `make test-gpu` (the gpu test tier), its log kept;
2. the GPU arm of `python -m bench loop_overhead` (bench/loop_overhead_gpu.py: gpt2_124m mb8, gpt2_350m mb8 and
   mb16, llama3_1b mb8 in bf16 and fp8, compiled blocks: tokens/s, MFU and ours / bare against the bare loop on the
   same GPU, and host-device syncs per steady step), quick plan unless GPU_CHECK_FULL=1;
3. the memory estimate against `torch.cuda.max_memory_allocated` (the CUDA arm of bench/memory_estimate.py).

Everything goes to bench/results/gpu/DATE_DEVICE/ (gpu_check.json, test_gpu.log), DATE in UTC and DEVICE the GPU's
name, so figures from different cards and days never overwrite each other. Without CUDA it says so and exits 2.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.__main__ import RESULTS

ROOT = Path(__file__).resolve().parent.parent


def _out_dir(device: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H%MZ")
    slug = re.sub(r"[^A-Za-z0-9.-]+", "-", device).strip("-")
    path = RESULTS / "gpu" / f"{stamp}_{slug}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _test_gpu(out: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    with open(out / "test_gpu.log", "w") as log:
        rc = subprocess.call([sys.executable, "-m", "pytest", "tests/gpu", "-q", "-rA"], cwd=ROOT, stdout=log,
                             stderr=subprocess.STDOUT)
    tail = (out / "test_gpu.log").read_text().strip().splitlines()[-1:] or [""]
    return {"returncode": rc, "summary": tail[0], "seconds": round(time.perf_counter() - t0, 1)}


def _loop_overhead_gpu(full: bool) -> dict[str, Any]:
    from bench import loop_overhead, loop_overhead_gpu
    from train import distributed

    env = loop_overhead._init_single_process()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return loop_overhead_gpu.run_gpu(*loop_overhead_gpu.GPU_PLAN["full" if full else "quick"], env, Path(tmp))
    finally:
        distributed.destroy_process_group()


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
    result["test_gpu"] = _test_gpu(out)
    print(f"test-gpu: {result['test_gpu']['summary']}", flush=True)
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2) + "\n")
    result["loop_overhead_gpu"] = _loop_overhead_gpu(full)
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2) + "\n")
    from bench import memory_estimate

    result["memory_estimate_cuda"] = memory_estimate.run_cuda(quick=not full)
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("loop_overhead_gpu", "memory_estimate_cuda")}, indent=1)[:6000])
    print(f"wrote {out}")
    return 0 if result["test_gpu"]["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
