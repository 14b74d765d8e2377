"""Where our loop and the bare loop spend a GPU's time: torch.profiler over steps 21-30 of each, on one GPU, for a
model of loop_overhead's GPU arm (bf16, compiled blocks, micro batch 8 x 1024); prints each one's device and host
time per step and its top ops by device and by host time.

    python -m bench.gpu_profile [MODEL]      # MODEL: llama3_1b (default), gpt2_350m, ...

Its output for llama3_1b on an H200 is bench/results/gpu/2026-11-28T0127Z_NVIDIA-H200/profile_llama3_1b.txt.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _show(name: str, prof: Any, steps: int) -> None:
    ka = prof.key_averages()
    device_ms = sum(e.self_device_time_total for e in ka) / steps / 1000
    print(f"==== {name}: self device time {device_ms:.2f} ms/step")
    print(ka.table(sort_by="self_device_time_total", row_limit=25, max_name_column_width=70))
    print(ka.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=70))


def main(model: str = "llama3_1b") -> int:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.profiler import ProfilerActivity, profile, schedule

    from bench.bare_loop import bare, init_single_process
    from bench.loop_overhead_gpu import GPU_COMMON
    from launcher.compose import compose_and_plan
    from train.loop import train

    if not torch.cuda.is_available():
        print("error: bench.gpu_profile needs a CUDA GPU (none visible)", file=sys.stderr)
        return 2
    env = init_single_process()
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    cfg, _ = compose_and_plan([*GPU_COMMON, f"model={model}", "precision=bf16", "trainer.max_steps=30"])
    with tempfile.TemporaryDirectory() as tmp:
        for arm in ("ours", "bare"):
            prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                           schedule=schedule(wait=20, warmup=0, active=10, repeat=1))
            prof.start()
            hook = register_optimizer_step_post_hook(lambda *_, p=prof: p.step())  # a profiler step per optimizer step
            t0 = time.time()
            if arm == "ours":
                (Path(tmp) / "ours").mkdir()
                train(cfg, env, device, Path(tmp) / "ours")
            else:
                bare(cfg, 30, device=device)
            hook.remove()
            prof.stop()
            print(f"{arm}: {time.time() - t0:.1f} s wall")
            _show(arm, prof, 10)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))
