"""The benchmark report: every benchmark's figures as ratios against their baselines, with the command that
measured each and its target, as report.json, a markdown table REPORT.md and one PNG chart (report.png).

Each benchmark module turns its own result into rows with `figures(result)` (the module knows its fields); a
result that says `skipped` becomes one row saying why (no SLURM cluster, no CUDA). Nothing here measures anything,
so the report can be rebuilt from stored results: `python -m bench.report [DIR]`.
"""

from __future__ import annotations

import importlib
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPORT_FILES = ("report.json", "REPORT.md", "report.png")


def rows_of(name: str, result: dict[str, Any]) -> list[dict[str, Any]]:
    command = result.get("command", f"python -m bench {name}")
    if "skipped" in result:
        rows = [{"figure": name, "value": None, "skipped": result["skipped"]}]
    else:
        from bench.registry import BENCHMARKS

        module = importlib.import_module(BENCHMARKS[name]) if name in BENCHMARKS else None
        rows = module.figures(result) if module is not None and hasattr(module, "figures") else []
    base = {"benchmark": name, "command": command, "measured_at": result.get("measured_at"),
            "quick": bool(result.get("quick", False))}
    return [{**base, "baseline": None, "target": None, "met": None, "detail": "", "skipped": None, **row}
            for row in rows]


def notes_of(name: str, result: dict[str, Any]) -> str:
    """A benchmark's own markdown section after the table (`notes(result)`: where the time goes, what limits a
    missed target), or ''."""
    from bench.registry import BENCHMARKS

    if "skipped" in result or name not in BENCHMARKS:
        return ""
    module = importlib.import_module(BENCHMARKS[name])
    text = module.notes(result) if hasattr(module, "notes") else ""
    return f"\n## {name}\n\n{text.strip()}\n" if text else ""


def load_results(directory: Path) -> dict[str, dict[str, Any]]:
    """Every benchmark result stored in `directory` (NAME.json), the report's own file left out."""
    results = {}
    for path in sorted(directory.glob("*.json")):
        if path.name not in REPORT_FILES:
            result = json.loads(path.read_text())
            if "measured_at" not in result:  # stored before results carried it: the file's time
                result["measured_at"] = _iso(datetime.fromtimestamp(path.stat().st_mtime, timezone.utc))
            results[path.stem] = result
    return results


def write_report(results: dict[str, dict[str, Any]], out_dir: Path) -> list[Path]:
    """report.json, REPORT.md and report.png in `out_dir` from these results (benchmark name -> result)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [row for name, result in results.items() for row in rows_of(name, result)]
    generated = _iso(datetime.now(timezone.utc))
    paths = [out_dir / f for f in REPORT_FILES]
    paths[0].write_text(json.dumps({"generated_at": generated, "rows": rows}, indent=2) + "\n")
    paths[1].write_text(markdown(rows, generated) + "".join(notes_of(name, r) for name, r in results.items()))
    chart(rows, paths[2])
    return paths


def markdown(rows: list[dict[str, Any]], generated: str) -> str:
    lines = [f"# Benchmarks ({generated})", "",
             "Every figure is a ratio measured within one run against its baseline (medians of several "
             "repetitions). `quick` rows come from `make bench-quick`: fewer repetitions, smaller sizes.", "",
             "| benchmark | figure | ratio | baseline | target | met | detail | command | measured |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        value = f"skipped: {r['skipped']}" if r["skipped"] else "-" if r["value"] is None else f"{r['value']:.3f}"
        met = {True: "yes", False: "**no**", None: ""}[r["met"]]
        command = f"`{r['command']}`" + (" (quick)" if r["quick"] else "")
        cells = [r["benchmark"], r["figure"], value, r["baseline"] or "", r["target"] or "", met, r["detail"],
                 command, (r["measured_at"] or "")[:10]]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def chart(rows: list[dict[str, Any]], path: Path) -> None:
    """One horizontal bar per measured figure, its target as a tick; red where the target is missed."""
    import matplotlib

    matplotlib.use("Agg")  # no display on build machines
    import matplotlib.pyplot as plt

    measured = [r for r in rows if r["value"] is not None]
    height = max(2.0, 0.45 * len(measured) + 1.2)
    fig, ax = plt.subplots(figsize=(10, height))
    labels = [f"{r['benchmark']}: {r['figure']}"[:70] for r in measured]
    colors = ["tab:red" if r["met"] is False else "tab:green" if r["met"] else "tab:gray" for r in measured]
    ax.barh(range(len(measured)), [r["value"] for r in measured], color=colors)
    for i, r in enumerate(measured):
        for target in _target_values(r["target"]):
            ax.plot([target, target], [i - 0.4, i + 0.4], color="black", linewidth=2)
    ax.axvline(1.0, color="gray", linestyle=":", linewidth=1)
    ax.set_yticks(range(len(measured)), labels, fontsize=8)
    ax.invert_yaxis()
    for i, r in enumerate(measured):
        ax.annotate(f"{r['value']:.3g}", (r["value"], i), xytext=(3, 0), textcoords="offset points",
                    va="center", fontsize=7)
    ax.set_xlabel("ratio against baseline (tick: target; green met, red missed, gray: no target)")
    skipped = [f"{r['benchmark']}: {r['figure']} (skipped: {r['skipped']})" for r in rows if r["skipped"]]
    if skipped:
        ax.set_title("not measured: " + "; ".join(skipped), fontsize=7, loc="left", wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _target_values(target: str | None) -> list[float]:
    """The chart's ticks: '<= 1.1x' -> [1.1], a band '0.95-1.05' -> [0.95, 1.05], no target -> []."""
    if not target:
        return []
    try:
        return [float(bound) for bound in target.lstrip("<>= ").rstrip("x").split("-")]
    except ValueError:
        return []


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds")


if __name__ == "__main__":
    from bench.registry import RESULTS

    directory = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS
    for written in write_report(load_results(directory), directory):
        print(written)
