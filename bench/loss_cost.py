"""What the loss costs (issue 46 item 1), on CPU, forward and backward in one run, against `F.cross_entropy` over the
whole fp32 copy of the logits (what a user writes, and what the bare loop runs):

1. Time, on the logits (bf16, as autocast makes them): the chunked loss (train/loss.py ChunkedCrossEntropy, each
   chunk's arithmetic eager, and compiled as strategy.compile runs it) against `F.cross_entropy(logits.float())`,
   vocabulary 32,000 and 128,256. The arms rotate their order each repetition in one process on one thread; a
   ratio is the median over the repetitions of the process's CPU time (other work on the shared cores does not
   stretch it). Target: at most 1.0x.
2. Peak memory, with the output layer (hidden states (tokens, d_model) fp32 and the output weight, the matmul in
   bf16 as autocast runs it): the plain loss (the logits, then F.cross_entropy), the chunked loss (the logits,
   then chunked) and the fused loss (trainer.loss_impl=fused: train/model/fused_head.py, no logits), each in a
   fresh subprocess: its resident memory's peak (VmHWM, reset through /proc/self/clear_refs after the inputs are
   made) above what it held before the step. Target at vocabulary 128,256 and 8,192 tokens: the fused loss below a
   third of the plain loss's. Each run's CPU time is recorded beside it. A plain arm is left out (and says so)
   where the machine has not the memory free for it.
cut-cross-entropy (the fused path's kernel on CUDA) needs Triton and a GPU: not measured here.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

COMMAND = "python -m bench loss_cost"
VOCABS = (32000, 128256)
TIME_TARGET = 1.0
MEMORY_TARGET = 1 / 3
D_MODEL = 512
# (tokens timed, repetitions, tokens for the memory runs)
FULL = {"time_tokens": 2048, "reps": 3, "memory_tokens": 8192}
QUICK = {"time_tokens": 512, "reps": 2, "memory_tokens": 2048}
TIME_ARMS = ("plain", "chunked", "chunked_compiled")
MEMORY_ARMS = ("plain", "chunked", "fused")


def _targets(tokens: int, vocab: int) -> Any:
    import torch

    from train.data.batches import IGNORE_INDEX

    targets = torch.randint(0, vocab, (tokens,), generator=torch.Generator().manual_seed(1))
    targets[::16] = IGNORE_INDEX  # some targets that don't count, as a fine-tuning prompt's
    return targets


def loss_step(arm: str, logits: Any, targets: Any) -> None:
    """One forward and backward of `arm`'s loss over (tokens, vocab) logits that require grad."""
    import torch.nn.functional as F

    from contract.rules.loss_chunks import CHUNK_BYTES
    from train.data.batches import IGNORE_INDEX
    from train.loss import ChunkedCrossEntropy

    if arm == "plain":
        loss = F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX)
    else:  # the chunked path at the rows the rule gives a large micro batch (chunk_rows above its threshold)
        rows = max(1, CHUNK_BYTES // (logits.shape[1] * 4))
        loss = ChunkedCrossEntropy.apply(logits, targets, rows, 0.0, arm == "chunked_compiled")[0]
    loss.backward()
    logits.grad = None


def time_vocab(vocab: int, tokens: int, reps: int) -> dict[str, Any]:
    import torch

    logits = (torch.randn(tokens, vocab, generator=torch.Generator().manual_seed(0)) * 2).to(torch.bfloat16)
    logits.requires_grad_()
    targets = _targets(tokens, vocab)
    t0 = time.perf_counter()
    for arm in TIME_ARMS:
        loss_step(arm, logits, targets)  # warm-up; the compiled arm compiles here
    warm_up_s = time.perf_counter() - t0
    cpu: dict[str, list[float]] = {arm: [] for arm in TIME_ARMS}
    for n in range(reps):
        order = TIME_ARMS[n % 3:] + TIME_ARMS[:n % 3]
        for arm in order:
            c0 = time.process_time()
            loss_step(arm, logits, targets)
            cpu[arm].append(time.process_time() - c0)
    out: dict[str, Any] = {"tokens": tokens, "reps": reps, "warm_up_s": round(warm_up_s, 1),
                           **{f"{arm}_cpu_ms": round(statistics.median(v) * 1000, 1) for arm, v in cpu.items()}}
    for arm in TIME_ARMS[1:]:
        ratios = [a / b for a, b in zip(cpu[arm], cpu["plain"], strict=True)]
        out[f"{arm}_ratio"] = round(statistics.median(ratios), 4)
    return out


def memory_arm(arm: str, vocab: int, tokens: int, d_model: int) -> dict[str, Any]:
    """In this (fresh) process: one forward and backward of the output layer and `arm`'s loss; the peak resident
    memory above what the process held before it, and its CPU time."""
    import torch

    from train.model.fused_head import FusedHeadLoss

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, d_model, generator=g).requires_grad_()
    weight = (torch.randn(vocab, d_model, generator=g) * 0.02).requires_grad_()
    targets = _targets(tokens, vocab)
    head = FusedHeadLoss(0.0, compiled=False)
    before = _status("VmRSS")
    _reset_peak()
    c0 = time.process_time()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if arm == "fused":
            loss = head(h, weight, targets)[0]
        else:
            logits = h @ weight.t()
    if arm == "fused":
        loss.backward()
    else:
        loss_step(arm, logits, targets)
        del logits
    cpu_s = time.process_time() - c0
    return {"peak_bytes": (_status("VmHWM") - before) * 1024, "cpu_s": round(cpu_s, 2)}


def _status(field: str) -> int:
    """A /proc/self/status field in kB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size (Linux 4.0+)


def plain_bytes(tokens: int, vocab: int) -> int:
    """What the plain arm holds at its peak, about: the bf16 logits, log-softmax's fp32 output and two fp32
    gradients (to decide whether this machine can run it)."""
    return tokens * vocab * (2 + 3 * 4)


def memory_vocab(vocab: int, tokens: int) -> dict[str, Any]:
    import psutil

    out: dict[str, Any] = {"tokens": tokens, "d_model": D_MODEL}
    for arm in MEMORY_ARMS:
        free = psutil.virtual_memory().available
        if arm == "plain" and plain_bytes(tokens, vocab) * 1.3 > free:
            out[arm] = {"skipped": f"needs about {plain_bytes(tokens, vocab) / 1e9:.1f} GB, {free / 1e9:.1f} GB free"}
            continue
        child = subprocess.run([sys.executable, "-m", "bench.loss_cost", "--memory-arm", arm, str(vocab),
                                str(tokens), str(D_MODEL)], capture_output=True, text=True, check=False,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
        if child.returncode:
            raise RuntimeError(f"loss_cost memory arm {arm} failed: {child.stderr[-2000:]}")
        out[arm] = json.loads(child.stdout.strip().splitlines()[-1])
    plain = out["plain"].get("peak_bytes")
    for arm in MEMORY_ARMS[1:]:
        out[f"{arm}_share"] = None if not plain else round(out[arm]["peak_bytes"] / plain, 4)
    return out


def run(quick: bool = False) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    plan = QUICK if quick else FULL
    timed = {str(v): time_vocab(v, plan["time_tokens"], plan["reps"]) for v in VOCABS}
    memory = {str(v): memory_vocab(v, plan["memory_tokens"]) for v in VOCABS}
    big = memory[str(VOCABS[-1])]
    time_met = all(t[f"{arm}_ratio"] <= TIME_TARGET for t in timed.values() for arm in ("chunked",))
    memory_met = big.get("fused_share") is not None and big["fused_share"] < MEMORY_TARGET
    return {"benchmark": "loss_cost", "torch": torch.__version__, "device": "cpu", "threads": 1, "quick": quick,
            "time": timed, "memory": memory, "time_target": TIME_TARGET, "memory_target": round(MEMORY_TARGET, 4),
            "target_met": time_met and memory_met, "command": COMMAND + (" --quick" if quick else "")}


def figures(r: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for vocab, t in r["time"].items():
        for arm in TIME_ARMS[1:]:
            rows.append({"figure": f"loss fwd+bwd, {arm.replace('_', ' ')}, vocab {int(vocab):,}, {t['tokens']:,} "
                                   "bf16 logits", "value": t[f"{arm}_ratio"],
                         "baseline": "F.cross_entropy over the fp32 copy of the logits",
                         "target": f"<= {r['time_target']}x" if arm == "chunked" else None,
                         "met": t[f"{arm}_ratio"] <= r["time_target"] if arm == "chunked" else None,
                         "detail": f"CPU {t[f'{arm}_cpu_ms']:.0f} ms vs {t['plain_cpu_ms']:.0f} ms, median of "
                                   f"{t['reps']}, one thread"})
    for vocab, m in r["memory"].items():
        big = int(vocab) == VOCABS[-1]
        for arm in MEMORY_ARMS[1:]:
            share = m.get(f"{arm}_share")
            plain = m["plain"].get("peak_bytes")
            rows.append({"figure": f"loss peak memory, {arm}, vocab {int(vocab):,}, {m['tokens']:,} tokens, output "
                                   f"layer d_model {m['d_model']}", "value": share,
                         "baseline": "the plain loss (the logits, then F.cross_entropy)",
                         "target": f"< {r['memory_target']:.3f}x" if big and arm == "fused" else None,
                         "met": (share is not None and share < r["memory_target"]) if big and arm == "fused" else None,
                         "skipped": m["plain"].get("skipped"),
                         "detail": f"{m[arm]['peak_bytes'] / 1e9:.2f} GB vs "
                                   f"{'?' if plain is None else f'{plain / 1e9:.2f}'} GB; CPU {m[arm]['cpu_s']} s vs "
                                   f"{m['plain'].get('cpu_s', '?')} s"})
    return rows


def report(r: dict[str, Any]) -> str:
    lines = [f"loss_cost ({r['command']}):"]
    for row in figures(r):
        value = "skipped" if row["value"] is None else f"{row['value']:.3f}x"
        target = "" if row["target"] is None else f" (target {row['target']}: {'met' if row['met'] else 'MISSED'})"
        lines.append(f"  {row['figure']}: {value} {row['baseline']}{target}; {row['detail']}")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--memory-arm":
        print(json.dumps(memory_arm(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))))
    else:
        print("usage: python -m bench loss_cost [--quick]", file=sys.stderr)
        sys.exit(2)
