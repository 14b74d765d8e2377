"""`python -m launcher.status [DIR] [--json] [--watch [SECONDS]] [--rank-by METRIC]`: a table with one row per run
(of a run directory, a sweep or a run root): step, loss, state, GPU-hours.

DIR is a run directory (config.yaml), a sweep directory (sweep.json) or a directory holding run directories
(run.root, e.g. outputs/); or a prepared dataset directory, or a folder of them (launcher.prepare.status: one row
per dataset, complete or not).
Which runs DIR holds: launcher/observe/runs.py; each run's row: launcher/observe/run_rows.py. This module draws
the table, its notes and the watch loop. A sweep's rows (any DIR's with --rank-by) are ranked, best first, by one
metric (launcher/observe/ranking.py), and a line under the table says which.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from contract.errors import EXIT_BAD_INPUT, ConfigError
from contract.rundir import eval_results, harness_scores, hf_export, metrics_file, validation_log
from launcher.commands import CommandParser
from launcher.observe.ranking import SweepRanking, rank_runs
from launcher.observe.run_rows import Row, collect, describe_best, total
from launcher.observe.runs import Target, find_runs

WATCH_DEFAULT_S = 10.0


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def state_cell(row: Row) -> Any:
    """The state, and in red since when the loss has been nan or inf, or far above the run's start (blown up): a
    diverged run must not look healthy."""
    from rich.text import Text

    if row.config_damage is not None:
        return Text(row.state, style="red")
    if row.loss is None:
        return row.state
    if row.loss_nonfinite_since is not None:
        return Text(f"{row.state}, loss {_fmt(row.loss, '.4f')} since step {row.loss_nonfinite_since}", style="red")
    if row.loss_blown_since is not None:  # finite, but far above where the run started: the rate is far too high
        return Text(f"{row.state}, loss far above its start since step {row.loss_blown_since}", style="red")
    return row.state


def rank(target: Target, rows: list[Row], rank_by: str | None, best_first: bool = True) -> SweepRanking | None:
    """A sweep's rows (any target's with --rank-by) ranked: each row's rank and value, and for the table the rows
    best first, those without a value last in their order (--json keeps the points' order); None: not ranked."""
    if target.sweep is None and not rank_by:
        return None
    ranked = rank_runs([run.run_dir for run in target.runs], rank_by)
    for row, run in zip(rows, target.runs, strict=True):
        row.rank, row.rank_value = ranked.ranks.get(run.run_dir), ranked.values.get(run.run_dir)
    if best_first:
        rows.sort(key=lambda row: (row.rank is None, row.rank or 0))
    return ranked


def table(rows: list[Row], summary: dict[str, Any] | None, title: str, ranked: SweepRanking | None = None) -> Any:
    from rich import box
    from rich.table import Table

    hour_units = [(unit, key) for unit, key in (("GPU-h", "gpu_hours"), ("CPU-h", "cpu_hours"))
                  if any(row.hours_unit == unit for row in rows)] or [("GPU-h", "gpu_hours")]
    show_cost = any(row.cost is not None for row in rows)
    show_validation = any(row.validation for row in rows)
    out = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                padding=(0, 1, 0, 0))
    if ranked is not None:
        out.add_column("rank", justify="right", no_wrap=True)
    out.add_column("run", min_width=8)
    for header in ("job", "state", "step", "ckpt", "requeues", "ends", "goodput", "loss", "tokens/s"):
        out.add_column(header, justify="left" if header in ("job", "state") else "right", no_wrap=True)
    if show_validation:
        out.add_column("val loss @step", justify="left")
    if ranked is not None:
        out.add_column(ranked.header, justify="right", no_wrap=True)
    for unit, _ in hour_units:
        out.add_column(unit, justify="right", no_wrap=True)
    if show_cost:
        out.add_column("cost", justify="right", no_wrap=True)
    for row in rows:
        step = "-" if row.step is None else f"{row.step}/{row.max_steps if row.max_steps is not None else '?'}"
        ends = ", ".join(f"{n} {kind}" for kind, n in sorted(row.events.items())) or "-"
        cells = [row.name, row.job, state_cell(row), step, _fmt(row.checkpoint_step, "d"), _fmt(row.requeues, "d"), ends,
                 "-" if row.goodput is None else f"{row.goodput:.0%}", _fmt(row.loss, ".4f"),
                 _fmt(row.tokens_per_s, ",.0f")]
        cells += [validation_log.describe(row.validation)] if show_validation else []
        if ranked is not None:
            cells = [_fmt(row.rank, "d"), *cells, _fmt(row.rank_value, ".4f")]
        cells += [_fmt(getattr(row, key), ".2f") for _, key in hour_units]
        out.add_row(*cells, *([_fmt(row.cost, ",.2f")] if show_cost else []))
    if summary is not None:
        states = ", ".join(f"{n} {state}" for state, n in sorted(summary["states"].items()))
        cells = [f"total ({summary['runs']} runs)", "", states, "", "", _fmt(summary["requeues"], ".0f"), "", "", "",
                 ""] + ([""] if show_validation else [])
        cells = ["", *cells, ""] if ranked is not None else cells
        cells += [_fmt(summary[key], ".2f") for _, key in hour_units]
        out.add_row(*cells, *([_fmt(summary["cost"], ",.2f")] if show_cost else []), style="bold", end_section=True)
    return out


def snapshot(path: Path, target: Target, clock: bool = False, rank_by: str | None = None) -> Any:
    """The table, then one line per damaged run's config.yaml and per run whose last attempt died of its
    environment, each with its way out (too long for a cell); the ranking's metric; each run's best checkpoint and
    its Hugging Face export (checkpoint.export_hf)."""
    from rich.console import Group
    from rich.text import Text

    rows = collect(target)
    ranked = rank(target, rows, rank_by)
    title = f"{path.resolve()}  {time.strftime('%X')}" if clock else str(path.resolve())
    notes = [Text(f"{row.name}: {row.config_damage}", style="red") for row in rows if row.config_damage]
    notes += [Text(f"{row.name}: {row.ending}", style="red") for row in rows if row.ending]
    notes += [Text(f"{row.name}: {note}", style="red") for row in rows for note in row.corruption]
    notes += [Text(f"{row.name}: {note}", style="yellow") for row in rows for note in row.stability]
    notes += [Text(f"{row.name}: {note}") for row in rows for note in row.cost_notes]  # what failures cost
    notes += [Text(f"{row.name}: {row.experts}") for row in rows if row.experts]
    notes += [Text(f"{row.name}: {eval_results.describe(row.evaluation)}") for row in rows if row.evaluation]
    notes += [Text(f"{row.name}: {harness_scores.line(row.harness)}") for row in rows if row.harness]
    notes += [Text(f"{row.name}: {describe_best(row.best)}") for row in rows if row.best]
    notes += [Text(f"{row.name}: {hf_export.describe(row.hf_export)}", style="" if row.hf_export["ok"] else "red")
              for row in rows if row.hf_export]
    notes = ([Text(ranked.describe())] if ranked is not None else []) + notes
    return Group(table(rows, total(rows) if target.sweep is not None else None, title, ranked), *notes)


def console() -> Any:
    from rich.console import Console

    # Piped into a file or another tool: no terminal width to fit, so don't wrap cells at 80 columns.
    return Console() if sys.stdout.isatty() else Console(width=200)


def watch(path: Path, target: Target, every_s: float, rank_by: str | None = None) -> int:
    return _watch(lambda first: snapshot(path, target if first else find_runs(path), clock=True, rank_by=rank_by),
                  every_s)


def _watch(render: Any, every_s: float) -> int:
    """Show render(True), then render(False) every `every_s` seconds until Ctrl-C."""
    from rich.live import Live

    try:
        with Live(render(True), console=console(), auto_refresh=False) as live:
            while True:
                time.sleep(every_s)
                live.update(render(False), refresh=True)
    except KeyboardInterrupt:
        return 0


def preparation(path: Path, datasets: list[Path], as_json: bool, every_s: float | None) -> int:
    """A prepared dataset directory, or a folder of them: one row per dataset (launcher.prepare.status)."""
    from launcher.prepare import status as prep

    def render(clock: bool) -> Any:
        title = f"{path.resolve()}  {time.strftime('%X')}" if clock else str(path.resolve())
        return prep.table([prep.preparation_row(d) for d in datasets], title)

    if every_s is not None:
        return _watch(lambda _first: render(True), every_s)
    if as_json:
        print(metrics_file.dumps({"rows": [asdict(prep.preparation_row(d)) for d in datasets]}, indent=2))
        return 0
    console().print(render(False))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="python -m launcher.status", description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("dir", nargs="?", default=".", type=Path,
                        help="a run directory, a sweep directory, a run.root, a prepared dataset directory or a "
                        "folder of them (default: .)")
    parser.add_argument("--json", action="store_true", help='print {"rows": [...], "total": {...}}')
    parser.add_argument("--watch", nargs="?", const=WATCH_DEFAULT_S, type=float, metavar="SECONDS",
                        help=f"refresh every SECONDS (default {WATCH_DEFAULT_S:g}) until Ctrl-C")
    parser.add_argument("--rank-by", metavar="METRIC",
                        help="rank the runs, best first, by this key of their measurements (val/NAME/loss, "
                        "harness/TASK/METRIC, loss; METRIC:max or :min when its name does not say which way is "
                        "better); default for a sweep: the first validation set's loss, else the training loss "
                        "averaged over the last logged interval")
    return parser


def main(argv: list[str] | None = None) -> int:
    from launcher.run.remote.commands import forward_or_none

    if (remote_code := forward_or_none("launcher.status", argv)) is not None:  # +remote=NAME or NAME:PATH
        return remote_code
    args = build_parser().parse_args(argv)
    try:
        if args.json and args.watch is not None:
            raise ConfigError("--json and --watch do not combine: drop one (loop `--json` yourself to poll)")
        if args.watch is not None and not args.watch > 0:
            raise ConfigError(f"--watch {args.watch:g}: give a positive number of seconds")
        from contract.search.layout import is_search_dir

        if not args.dir.is_dir():
            raise ConfigError(f"{args.dir} is not a directory: pass a run directory, a sweep or search directory, a "
                              "run.root, or a prepared dataset (or a folder of them)")
        if is_search_dir(args.dir):  # a hyperparameter search: its trials, from the study
            from launcher.sweeps.search_status import main_status

            return main_status(args.dir, args.json)
        if args.dir.is_dir() and not (args.dir / "config.yaml").is_file():
            from launcher.prepare.status import preparations

            datasets = preparations(args.dir)
            if datasets:
                return preparation(args.dir, datasets, args.json, args.watch)
        target = find_runs(args.dir)
        if args.rank_by:
            rank_runs([run.run_dir for run in target.runs], args.rank_by)  # a metric no run measured: refused now
        if args.watch is not None:
            return watch(args.dir, target, args.watch, args.rank_by)
        if args.json:
            rows = collect(target)
            ranked = rank(target, rows, args.rank_by, best_first=False)
            # Strict JSON: a non-finite loss prints as "nan" / "inf", as in metrics.jsonl.
            extra = {} if ranked is None else {"ranked_by": {"metric": ranked.ranking.metric, "words": ranked.words,
                                                             "direction": ranked.ranking.direction}}
            print(metrics_file.dumps({"rows": [asdict(row) for row in rows], "total": total(rows), **extra},
                                     indent=2))
            return 0
        console().print(snapshot(args.dir, target, rank_by=args.rank_by))
        return 0
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    from launcher.commands import run

    run(main)
