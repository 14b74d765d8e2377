"""What `python -m launcher.prepare` adds around the tokenizer: its end-to-end tokens/s (finding and reading the
files, splitting train/validation, tokenizing, writing the shards and the manifest, every worker) against the same
BPE tokenizer's own `encode_batch` over the same documents already in memory, using every core (its Rust threads).

The corpus is JSON Lines files of Zipf-distributed English-like words (written here, nothing downloaded); the
tokenizer a byte-level BPE of 8,192 ids trained here on a sample of it. The preparation runs in this process through
the command's own `main` (argument parsing to manifest, worker processes spawned as the command spawns them; only
the interpreter's start is left out), in two arms: "default", the command with its defaults (this corpus is one
task of the default --task-mb, tokenized in the command's own process on every core, as the default --workers
does below 32 MB); and "workers", one task per file with --workers set to the CPU count, so that worker processes
start whatever the size (shown, no target: it prices starting them on a corpus this small). Both produce exactly
the tokens the baseline counts (checked), plus an end-of-document id per document, not counted.
Arms alternate within each repetition so that a drift of the shared machine's speed cancels; each ratio is the
median over the repetitions of baseline time / prepare time; CPU seconds (threads and worker processes included)
are recorded beside the wall times. Target (issue 20): at least 0.8x of encode_batch for "default".
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from launcher.prepare import pool as pool_module

COMMAND = "python -m bench prepare_throughput"
TARGET = 0.8
VOCAB = 8192
FULL = {"files": 16, "docs_per_file": 150, "repeats": 4}
QUICK = {"files": 8, "docs_per_file": 150, "repeats": 1}


def write_corpus(root: Path, files: int, docs_per_file: int, seed: int = 0) -> list[str]:
    """JSON Lines files of documents of 100-600 Zipf-distributed words; returns the documents in file order."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    letter_p = np.arange(26, 0, -1) / np.arange(26, 0, -1).sum()
    sizes = rng.integers(1, 11, 20000)
    chars = rng.choice(letters, size=int(sizes.sum()), p=letter_p)
    ends, chars_list = np.cumsum(sizes), chars.tolist()
    words = np.array(
        ["".join(chars_list[e - n : e]) for e, n in zip(ends.tolist(), sizes.tolist(), strict=True)]
    )
    word_p = 1.0 / np.arange(1, len(words) + 1)
    word_p /= word_p.sum()
    root.mkdir(parents=True)
    lengths = rng.integers(100, 600, files * docs_per_file)
    # one draw for every word of the corpus (inverse CDF of the Zipf weights), then cut into documents
    picks = words[
        np.searchsorted(np.cumsum(word_p), rng.random(int(lengths.sum())), side="right").clip(
            0, len(words) - 1
        )
    ]
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    picked, bounds_list = picks.tolist(), bounds.tolist()
    docs = [" ".join(picked[bounds_list[i] : bounds_list[i + 1]]) + "." for i in range(len(lengths))]
    for f in range(files):
        part = docs[f * docs_per_file : (f + 1) * docs_per_file]
        (root / f"part-{f:03d}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in part))
    return docs


def train_tokenizer(docs: list[str], path: Path) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(docs[: max(200, len(docs) // 8)], trainer)
    tok.save(str(path))
    return tok


def time_prepare(corpus: Path, tokenizer: Path, out: Path, options: list[str]) -> tuple[float, int]:
    """Seconds of one preparation through the command's main, and the tokens it wrote less its eod ids."""
    from contract.data.manifest import load_manifest
    from launcher.prepare.__main__ import main

    argv = [str(corpus), "--out", str(out), "--tokenizer", str(tokenizer), *options]
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    elapsed = time.perf_counter() - t0
    if code != 0:
        raise RuntimeError(f"prepare exited {code}")
    m = load_manifest(out)
    return elapsed, sum(m.split(s).tokens - m.split(s).documents for s in ("train", "val"))


def _cpu_s() -> float:
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def worker_start_s(tokenizer: Path, corpus: Path) -> float:
    """Wall seconds until one spawned worker process is ready (interpreter, imports, the tokenizer loaded): the
    fixed cost of each worker process a preparation starts."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from launcher.prepare.inputs import resolve_inputs
    from launcher.prepare.plan import Options, make_plan
    from launcher.prepare.tokenizer import load_tokenizer

    plan = make_plan(
        corpus.parent / "unused", load_tokenizer(str(tokenizer)), Options(), resolve_inputs([str(corpus)])
    )
    ctx = mp.get_context("spawn")
    t0 = time.perf_counter()
    with ProcessPoolExecutor(
        1,
        mp_context=ctx,
        initializer=pool_module._init_worker,
        initargs=(plan, 1, ctx.Queue(), ctx.Event(), os.getpid()),
    ) as pool:
        pool.submit(int, 0).result()
    return time.perf_counter() - t0


TARGETED = ("default",)


def run(quick: bool = False) -> dict[str, Any]:
    from launcher.prepare.pool import cpu_count

    plan = QUICK if quick else FULL
    load = os.getloadavg()
    cpus = cpu_count()
    times: dict[str, list[float]] = {"encode_batch": [], "default": [], "workers": []}
    cpu: dict[str, list[float]] = {arm: [] for arm in times}
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        docs = write_corpus(tmp / "corpus", plan["files"], plan["docs_per_file"])
        corpus_mb = sum(f.stat().st_size for f in (tmp / "corpus").iterdir()) / 2**20
        tok = train_tokenizer(docs, tmp / "tokenizer.json")
        per_file = f"{corpus_mb / plan['files'] * 0.99:.4f}"
        arms = {"default": [], "workers": ["--task-mb", per_file, "--workers", str(cpus)]}
        tokens = sum(len(e.ids) for e in tok.encode_batch(docs, add_special_tokens=False))  # warm-up, count
        for rep in range(plan["repeats"]):
            order = list(times)
            for arm in order if rep % 2 == 0 else order[::-1]:
                cpu0 = _cpu_s()
                if arm == "encode_batch":
                    t0 = time.perf_counter()
                    encoded = tok.encode_batch(docs, add_special_tokens=False)
                    times[arm].append(time.perf_counter() - t0)
                    assert sum(len(e.ids) for e in encoded) == tokens
                    del encoded
                else:
                    out = tmp / f"{arm}-{rep}"
                    elapsed, written = time_prepare(tmp / "corpus", tmp / "tokenizer.json", out, arms[arm])
                    if written != tokens:
                        raise RuntimeError(f"prepare wrote {written} tokens, encode_batch counted {tokens}")
                    times[arm].append(elapsed)
                cpu[arm].append(_cpu_s() - cpu0)
        start_s = worker_start_s(tmp / "tokenizer.json", tmp / "corpus")

    def ratio(samples: dict[str, list[float]], arm: str) -> float:
        return statistics.median(b / a for a, b in zip(samples[arm], samples["encode_batch"], strict=True))

    arm_names = [arm for arm in times if arm != "encode_batch"]
    ratios = {arm: round(ratio(times, arm), 3) for arm in arm_names}
    return {
        "benchmark": "prepare_throughput",
        "cpus": cpus,
        "corpus_mb": round(corpus_mb, 2),
        "files": plan["files"],
        "documents": len(docs),
        "tokens": tokens,
        "vocab_size": VOCAB,
        "tokens_per_s": {arm: round(tokens / statistics.median(xs)) for arm, xs in times.items()},
        "ratio": ratios,
        "cpu_ratio": {arm: round(ratio(cpu, arm), 3) for arm in arm_names},
        "target_ratio": TARGET,
        "target_met": all(ratios[arm] >= TARGET for arm in TARGETED),
        "repeats": plan["repeats"],
        "quick": quick,
        "command": COMMAND,
        "seconds": {arm: [round(x, 3) for x in xs] for arm, xs in times.items()},
        "cpu_seconds": {arm: [round(x, 3) for x in xs] for arm, xs in cpu.items()},
        "worker_start_s": round(start_s, 3),
        "tokenizers": _version("tokenizers"),
        "load_average": [round(x, 2) for x in load],  # of the machine (1, 5, 15 min) when the run started
    }


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def _label(r: dict[str, Any], arm: str) -> str:
    return {
        "default": "prepare tokens/s, defaults",
        "workers": f"prepare tokens/s, {r['files']} tasks on --workers {r['cpus']}",
    }[arm]


def figures(r: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for arm, value in r["ratio"].items():
        targeted = arm in TARGETED
        rows.append(
            {
                "figure": _label(r, arm),
                "value": value,
                "baseline": "the tokenizer's encode_batch over the documents in memory, every core",
                "target": f">= {r['target_ratio']}" if targeted else None,
                "met": value >= r["target_ratio"] if targeted else None,
                "detail": f"{r['tokens_per_s'][arm]:,} of {r['tokens_per_s']['encode_batch']:,} tokens/s; CPU time "
                f"{1 / r['cpu_ratio'][arm]:.2f}x encode_batch's; {r['corpus_mb']} MB JSONL"
                + ("" if targeted else f"; worker processes start in {r['worker_start_s']:.2f} s"),
            }
        )
    return rows


def report(r: dict[str, Any]) -> str:
    verdict = "met" if r["target_met"] else "MISSED"
    arms = ", ".join(
        f"{_label(r, arm).removeprefix('prepare tokens/s, ')} {r['ratio'][arm]:.2f}x" for arm in r["ratio"]
    )
    return (
        f"prepare_throughput: {r['corpus_mb']} MB of JSON Lines ({r['documents']:,} documents, "
        f"{r['tokens']:,} tokens, BPE {r['vocab_size']}) on {r['cpus']} CPUs: encode_batch in memory "
        f"{r['tokens_per_s']['encode_batch']:,} tokens/s; prepare end to end: {arms} "
        f"(target >= {r['target_ratio']} with the defaults: {verdict})"
    )


def _table(samples: dict[str, list[float]], repeats: int) -> list[str]:
    lines = [
        "| arm | " + " | ".join(f"rep {i + 1}" for i in range(repeats)) + " |",
        "| --- |" + " --- |" * repeats,
    ]
    return lines + [f"| {arm} | " + " | ".join(f"{x:.2f}" for x in xs) + " |" for arm, xs in samples.items()]


def notes(r: dict[str, Any]) -> str:
    from launcher.prepare.pool import AUTO_MB_PER_WORKER

    base = r["seconds"]["encode_batch"]
    lines = [
        "Wall seconds per repetition (arms alternate in order within each repetition):",
        "",
        *_table(r["seconds"], r["repeats"]),
        "",
        f"The same encode_batch call took {min(base):.2f} to {max(base):.2f} s across the repetitions; the "
        f"machine's load average was {r['load_average'][0]} on its {r['cpus']} CPUs when the run started (other "
        f"work shares them). CPU seconds (this process, its threads and its worker processes), less sensitive to "
        f"that load:",
        "",
        *_table(r["cpu_seconds"], r["repeats"]),
        "",
        "What the preparation adds around the tokenizer, in CPU time: reading and parsing the files, the split's "
        "hash per document, the ids out of the tokenizer's Encoding objects into one array per batch, and the "
        "shard writes with their sha256: "
        + ", ".join(f"{1 / r['cpu_ratio'][arm] - 1:.0%} ({arm})" for arm in r["cpu_ratio"])
        + f". A worker process takes {r['worker_start_s']:.2f} s to start here (a spawned interpreter, numpy, the "
        f"tokenizer loaded): that is why the default --workers starts one per "
        f"{AUTO_MB_PER_WORKER:g} MB of input at most, and why forcing them on this {r['corpus_mb']} MB corpus (and "
        f"{r['files']} tasks of {r['corpus_mb'] / r['files']:.2f} MB, each its own encode calls and files) costs what the 'workers' "
        f"arm shows. On a corpus of gigabytes the start is paid once and the worker processes share the cores (the "
        f"command's own process works meanwhile).",
    ]
    return "\n".join(lines)
