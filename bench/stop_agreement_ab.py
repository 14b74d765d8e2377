"""What the per-step stop agreement (train/faults/preemption.py `stop_requested`, one tiny gloo all-reduce at every
step boundary) costs a tiny DDP step on 2 CPU ranks, measured within each run so that a shared machine's drift
cancels: the real loop (loop_overhead's `tiny` case, strategy=ddp) with the agreement done on blocks of BLOCK steps
and skipped on the next BLOCK, alternating. Diagnostic only: no signal is sent and both ranks skip the same steps,
so skipping cannot desynchronise them; nothing here changes the loop.

    python -m bench.stop_agreement_ab [RUNS] [STEPS]      # defaults 8 runs of 200 steps

Per run, rank 0's median wall time of a step (from its start to the next step's start, log and collection steps
left out) with and without the agreement, their ratio, and the agreement's own median wall time per call (its wait
for the other rank included) as a share of the step. Loop_overhead's ddp ratio compares separate runs, whose
step times drift by up to 2x while another job loads the machine; these ratios are taken within one run.

Why the loop keeps the agreement as it is: it must read every rank's flags as they stand at the step boundary (a
signal that came during the step or its validation stops at that step; the stability verdict of that step is in
it), and only a round trip after the boundary reads them. Anything cheaper moves that point earlier: an all-reduce
issued at the step's start or carried in DDP's gradient buckets sees the signal a step later and the stability
verdict a step late. Its CPU cost does not depend on how it is called (a reused buffer read through numpy costs
what a new tensor does: about 0.3 ms of the calling thread and 0.2-0.7 ms of gloo's threads a call, both on the
loaded 2-core machine). The output of one run is bench/results/stop_agreement_ab.txt.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BLOCK = 3
WORLD = 2


def _with_agreement(step: int) -> bool:
    return ((step - 1) // BLOCK) % 2 == 0


def _worker(rank: int, world: int, port: int, out: str, runs: int, steps: int) -> None:
    import torch

    import train.faults.preemption as preemption
    import train.observe.sync_count as sync_count
    from bench.loop_overhead import CASES, COMMON, join_gloo
    from launcher.compose import compose_and_plan
    from train import distributed
    from train.loop import train

    env = join_gloo(rank, world, port)
    agree, begins = preemption.PreemptionWatcher.stop_requested, sync_count.step_begins
    starts: dict[int, float] = {}
    calls: list[float] = []

    def stop_requested(self: Any, step: int, trouble: int = 0) -> bool:
        if not _with_agreement(step):
            self.agreed, self.trouble = preemption.NOTHING, trouble
            return False
        t0 = time.perf_counter()
        stop = agree(self, step, trouble)
        calls.append(time.perf_counter() - t0)
        return bool(stop)

    def step_begins(step: int) -> None:
        starts[step] = time.perf_counter()
        begins(step)

    preemption.PreemptionWatcher.stop_requested = stop_requested  # type: ignore[method-assign]
    sync_count.step_begins = step_begins
    cfg, _ = compose_and_plan([*COMMON, *CASES["tiny"]["overrides"], f"local.nproc={world}", "strategy=ddp",
                               f"trainer.max_steps={steps}"])
    rows = []
    try:
        for run in range(runs):
            starts.clear()
            calls.clear()
            run_dir = Path(out) / str(run)
            if rank == 0:
                run_dir.mkdir(parents=True)
            torch.distributed.barrier()
            train(cfg, env, torch.device("cpu"), run_dir)
            kept: dict[bool, list[float]] = {True: [], False: []}
            for s in range(11, steps):  # the first 10 steps are warm-up; log (every 10) and gc (50) steps left out
                if s % 10 not in (0, 1):
                    kept[_with_agreement(s)].append(starts[s + 1] - starts[s])
            with_ms, without_ms = (statistics.median(kept[k]) * 1000 for k in (True, False))
            call_ms = statistics.median(calls) * 1000
            rows.append((with_ms, without_ms, call_ms))
            if rank == 0:
                print(f"run {run}: step {with_ms:.2f} ms with the agreement, {without_ms:.2f} ms without "
                      f"(without/with {without_ms / with_ms:.3f}); the agreement {call_ms:.2f} ms a call "
                      f"({call_ms / with_ms:.1%} of the step)", flush=True)
    finally:
        preemption.PreemptionWatcher.stop_requested = agree  # type: ignore[method-assign]
        sync_count.step_begins = begins
        distributed.destroy_process_group()
    if rank == 0:
        ratios = sorted(b / a for a, b, _ in rows)
        shares = [c / a for a, _, c in rows]
        print(f"median over {runs} runs: without/with {statistics.median(ratios):.3f} (runs {ratios[0]:.3f}-"
              f"{ratios[-1]:.3f}, {sum(r < 1 for r in ratios)} of {runs} below 1); the agreement "
              f"{statistics.median(shares):.1%} of a step")


def main(argv: list[str]) -> None:
    import torch.multiprocessing as mp

    from bench.ports import hosted_port

    runs, steps = (int(argv[0]) if argv else 8), (int(argv[1]) if len(argv) > 1 else 200)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(WORLD, hosted_port(WORLD), tmp, runs, steps), nprocs=WORLD)


if __name__ == "__main__":
    main(sys.argv[1:])
