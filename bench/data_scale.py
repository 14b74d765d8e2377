"""What a rank pays to open a corpus of one trillion tokens and read its first step's batch, against a small file.

Each measurement is a fresh Python process (so its memory starts clean) that imports what a rank imports, then
times what the loop does before its first step's data is ready: the data's fingerprint (contract/data/fingerprint.py,
saved with checkpoints: a megabyte of sampled blocks), the data source (data=tokens data.path=FILE,
train/data/sources.py: the file resolved, the window order set up) and one step's global batch
(BATCH sequences of SEQ_LEN + 1 tokens, as load_micro_batch makes them). Its peak RSS growth is ru_maxrss after
minus ru_maxrss before. The big file is sparse (`truncate` to 2 TB of uint16: no disk used, reads are zero pages);
the small one holds 1M tokens. The runs alternate, REPEATS of each; medians.

Targets (issue 20): under 5 s and under 100 MB for the trillion tokens. The window order is a bijection computed
per index (train/data/index.py); the per-epoch permutation it replaced took 121 s and 3.8 GB of peak RSS growth for
the same open and batch on this 2-core machine (measured once, the code before commit df7b371).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TARGET_S = 5.0
TARGET_MB = 100.0
BIG_TOKENS, SMALL_TOKENS = 10**12, 10**6
SEQ_LEN, BATCH = 2048, 256
REPEATS = 5


def measure(path: str) -> dict[str, float]:
    """In a fresh process: seconds and peak RSS growth (MB) to open `path` and load one step's batch."""
    import resource
    import time

    from omegaconf import OmegaConf

    from contract.data.fingerprint import data_fingerprint
    from train.data import build_source, load_micro_batch

    cfg = OmegaConf.create({"name": "tokens", "path": path, "dtype": "uint16", "seq_len": SEQ_LEN, "seed": 1,
                            "shuffle": True, "_target_": None, "sources": {}})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    data_fingerprint(cfg, on_ranks=True)
    source = build_source(cfg, vocab_size=65536)
    inputs, _ = load_micro_batch(source, range(BATCH))
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert inputs.shape == (BATCH, SEQ_LEN)
    return {"seconds": seconds, "rss_growth_mb": (after - before) / 1024}


def _in_child(path: Path) -> dict[str, float]:
    code = f"import json; from bench.data_scale import measure; print(json.dumps(measure({str(path)!r})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> dict[str, Any]:
    repeats = 2 if quick else REPEATS
    with tempfile.TemporaryDirectory() as tmp:
        big, small = Path(tmp) / "trillion.bin", Path(tmp) / "million.bin"
        with open(big, "wb") as f:
            f.truncate(2 * BIG_TOKENS)
        with open(small, "wb") as f:
            f.write(bytes(range(256)) * (2 * SMALL_TOKENS // 256) + b"\0" * (2 * SMALL_TOKENS % 256))
        runs: dict[str, list[dict[str, float]]] = {"big": [], "small": []}
        for _ in range(repeats):
            runs["big"].append(_in_child(big))
            runs["small"].append(_in_child(small))

    def median(which: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[which])

    seconds_big, seconds_small = median("big", "seconds"), median("small", "seconds")
    mb_big, mb_small = median("big", "rss_growth_mb"), median("small", "rss_growth_mb")
    return {
        "benchmark": "data_scale",
        "command": "python -m bench data_scale" + (" --quick" if quick else ""),
        "quick": quick,
        "tokens_big": BIG_TOKENS, "tokens_small": SMALL_TOKENS, "seq_len": SEQ_LEN, "batch": BATCH,
        "repeats": repeats,
        "seconds_big": round(seconds_big, 4), "seconds_small": round(seconds_small, 4),
        "rss_growth_mb_big": round(mb_big, 2), "rss_growth_mb_small": round(mb_small, 2),
        "seconds_big_all": [round(r["seconds"], 4) for r in runs["big"]],
        "rss_growth_mb_big_all": [round(r["rss_growth_mb"], 2) for r in runs["big"]],
        "target_s": TARGET_S, "target_mb": TARGET_MB,
        "target_met": seconds_big < TARGET_S and mb_big < TARGET_MB,
    }


def figures(r: dict[str, Any]) -> list[dict[str, Any]]:
    batch = f"a batch of {r['batch']} x {r['seq_len'] + 1} tokens"
    return [{"figure": "open + first batch: 1T-token file / 1M-token file",
             "value": round(r["seconds_big"] / r["seconds_small"], 3), "baseline": "the same on a 1M-token file",
             "target": f"1T under {r['target_s']:g} s", "met": r["seconds_big"] < r["target_s"],
             "detail": f"{r['seconds_big']:.3f} s against {r['seconds_small']:.3f} s, {batch}"},
            {"figure": "peak RSS growth: 1T-token file / 1M-token file",
             "value": round(r["rss_growth_mb_big"] / max(r["rss_growth_mb_small"], 0.01), 3),
             "baseline": "the same on a 1M-token file", "target": f"1T under {r['target_mb']:g} MB",
             "met": r["rss_growth_mb_big"] < r["target_mb"],
             "detail": f"{r['rss_growth_mb_big']:.1f} MB against {r['rss_growth_mb_small']:.1f} MB"}]


def report(r: dict[str, Any]) -> str:
    verdict = "met" if r["target_met"] else "MISSED"
    return (f"data_scale: opening a {r['tokens_big']:.0e}-token file and loading one step's batch took "
            f"{r['seconds_big']:.3f} s and {r['rss_growth_mb_big']:.1f} MB of peak RSS growth (a "
            f"{r['tokens_small']:.0e}-token file: {r['seconds_small']:.3f} s, {r['rss_growth_mb_small']:.1f} MB); "
            f"targets under {r['target_s']:g} s and {r['target_mb']:g} MB: {verdict}")


if __name__ == "__main__":
    print(report(run(quick="--quick" in sys.argv)))
