"""The benchmark report from given results (no benchmark runs): report.json, REPORT.md and one PNG."""

from __future__ import annotations

import json
from pathlib import Path

from bench.report import REPORT_FILES, load_results, write_report

RESULTS = {
    "checkpoint_stall": {"benchmark": "checkpoint_stall", "state_mb": 1423.6, "sync_save_s": 4.97,
                         "async_stall_s": 0.125, "stall_ratio": 0.0252, "target_ratio": 0.1, "target_met": True,
                         "command": "python -m bench checkpoint_stall"},
    "loop_overhead": {
        "benchmark": "loop_overhead", "quick": True, "command": "python -m bench loop_overhead --quick",
        "target_met": False, "ddp_2_ranks": {"skipped": "not measured yet"}, "gpu": {"skipped": "no CUDA"},
        "cases": {
            "tiny": {"params_m": 0.12, "ratio": 1.142, "pair_ratios": [1.142], "target_ratio": 1.1,
                     "target_met": False, "step_ms_ours": 22.8, "step_ms_bare": 20.0, "ratio_no_prefetch": 1.19,
                     "step_ms_ours_no_prefetch": 23.8},
            "gpt_24m": {"params_m": 23.6, "ratio": 1.01, "pair_ratios": [1.01], "target_ratio": 1.03,
                        "target_met": True, "step_ms_ours": 505.0, "step_ms_bare": 500.0},
        },
    },
    "memory_estimate": {
        "benchmark": "memory_estimate", "quick": True, "command": "python -m bench memory_estimate --quick",
        "target_met": True, "world_size": 2, "config": ["local.nproc=2"], "seconds": 30.0,
        "rows": [
            {"run": "zero2", "strategy": "zero2", "precision": "fp32", "activation_checkpointing": False,
             "component": "states", "estimated_bytes": 26727936.0, "measured_bytes_per_rank": [26984704, 26734848],
             "ratio": 0.9905, "tolerance": 0.05, "target_met": True},
            {"run": "ddp bf16 checkpointing", "strategy": "ddp", "precision": "bf16", "activation_checkpointing": True,
             "component": "activations", "estimated_bytes": 583936.0, "measured_bytes_per_rank": [601344, 601344],
             "ratio": 0.9711, "tolerance": None, "target_met": None},
        ],
        "cuda": {"skipped": "no CUDA"},
    },
    "submit_latency": {"skipped": "no local SLURM cluster (make slurm-up)", "target_met": True},
}


def test_report_writes_json_markdown_and_a_png_chart(tmp_path: Path) -> None:
    paths = write_report(RESULTS, tmp_path / "out")
    assert [p.name for p in paths] == list(REPORT_FILES)
    report = json.loads(paths[0].read_text())
    rows = {(r["benchmark"], r["figure"]): r for r in report["rows"]}
    tiny = rows[("loop_overhead", "loop overhead, tiny (0.12M params), 1 process")]
    assert tiny["value"] == 1.142 and tiny["met"] is False and tiny["target"] == "<= 1.1x" and tiny["quick"]
    assert tiny["command"] == "python -m bench loop_overhead --quick"
    stall = rows[("checkpoint_stall", "async checkpoint stall")]
    assert stall["value"] == 0.0252 and stall["met"] is True
    states = rows[("memory_estimate", "zero2 fp32: params + grads + optimizer state")]
    assert states["value"] == 0.9905 and states["met"] is True and states["target"] == "0.95-1.05"
    activations = rows[("memory_estimate", "ddp bf16: activations, checkpointed")]
    assert activations["value"] == 0.9711 and activations["met"] is None and activations["target"] is None
    assert rows[("memory_estimate", "memory estimate vs CUDA peak, gpt2_124m/350m on one GPU")]["skipped"] == "no CUDA"
    assert rows[("submit_latency", "submit_latency")]["command"] == "python -m bench submit_latency"
    md = paths[1].read_text()
    assert "| checkpoint_stall | async checkpoint stall | 0.025 |" in md
    assert "skipped: no CUDA" in md and "`python -m bench loop_overhead --quick` (quick)" in md
    assert "**no**" in md  # the missed target stands out
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stored_results_are_read_back_without_the_report_itself(tmp_path: Path) -> None:
    for name, result in RESULTS.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(result))
    write_report(RESULTS, tmp_path)
    loaded = load_results(tmp_path)
    assert sorted(loaded) == sorted(RESULTS)
    assert all("measured_at" in r for r in loaded.values())


def test_gpu_and_ddp_loop_figures_become_rows_with_their_targets() -> None:
    from bench.loop_overhead import figures

    result = {**RESULTS["loop_overhead"],
              "ddp_2_ranks": {"tiny": {"world_size": 2, "ratio": 1.12, "target_ratio": 1.1, "target_met": False,
                                       "step_ms_ours": 39.0, "step_ms_bare": 34.8}},
              "gpu": {"device": "NVIDIA H100 80GB HBM3", "peak_bf16_tflops": 989.4,
                      "gpt2_124m mb8": {"ratio": 0.985, "target_ratio": 0.97, "target_met": True,
                                        "tokens_per_s_ours": 98500.0, "tokens_per_s_bare": 100000.0,
                                        "mfu_ours": 0.4, "mfu_bare": 0.406, "syncs_per_steady_step": 0.0},
                      "fp8_speedup": {"value": 1.3, "target": 1.25}}}
    rows = {r["figure"]: r for r in figures(result)}
    ddp = rows["loop overhead, tiny, ddp on 2 ranks"]
    assert ddp["value"] == 1.12 and ddp["met"] is False and ddp["target"] == "<= 1.1x"
    gpu = rows["GPU tokens/s, gpt2_124m mb8 compiled (NVIDIA H100 80GB HBM3)"]
    assert gpu["value"] == 0.985 and gpu["met"] is True and gpu["target"] == ">= 0.97"
    assert "MFU 40.0% vs 40.6%; 0 syncs per steady step" in gpu["detail"]
    assert not any(r.get("skipped") for r in rows.values())  # nothing reported as skipped once measured


def test_where_the_time_goes_follows_the_table(tmp_path: Path) -> None:
    loop = {**RESULTS["loop_overhead"],
            "profile": {"case": "tiny", "steps": 100, "total_s": 3.2,
                        "top": [{"function": "run_backward", "calls": 100, "own_s": 1.4, "cumulative_s": 1.4,
                                 "share": 0.4375}]}}
    submit = {"median_s": {"single": 1.0, "torch_import": 2.8, "sweep4": 1.4, "sweep64": 6.0},
              "single_vs_torch_import": 0.357, "sweep64_vs_single": 6.0, "sweep4_vs_single": 1.4,
              "breakdown_s": {"interpreter": 0.1, "imports": 0.3, "compose": 0.4, "sbatch": 0.05,
                              "plan_checks_rundir_submitit": 0.15},
              "command": "python -m bench submit_latency"}
    md = write_report({"loop_overhead": loop, "submit_latency": submit}, tmp_path)[1].read_text()
    table_end = md.index("\n## ")
    loop_notes = md[md.index("## loop_overhead"):]
    assert table_end < md.index("## loop_overhead") and "| `run_backward` | 100 | 1.400 | 43.8% |" in loop_notes
    assert "without background loading costs 1.190x the bare loop, with it 1.142x" in loop_notes
    submit_notes = md[md.index("## submit_latency"):]
    assert "| compose | 0.40 | 40% |" in submit_notes and "is 0.70 s" in submit_notes
    assert "largest stages are compose and imports" in submit_notes
