"""make bench: every benchmark, each reported as ratios measured within one run, results under bench/results/,
then the report of all stored results (report.json, REPORT.md, report.png; see bench/report.py).
`--quick` (make bench-quick, CI smoke): fewer repetitions and smaller sizes, into bench/results/quick/."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from datetime import datetime, timezone

from bench.registry import BENCHMARKS, RESULTS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", default=list(BENCHMARKS), help=f"subset of {', '.join(BENCHMARKS)}")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, smaller sizes (CI smoke)")
    args = parser.parse_args(argv)
    out_dir = RESULTS / "quick" if args.quick else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = []
    for name in args.names:
        module = importlib.import_module(BENCHMARKS[name])
        result = module.run(quick=args.quick)
        result["measured_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        (out_dir / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
        print(module.report(result))
        if not result.get("target_met", True):
            failed.append(name)
    from bench.report import load_results, write_report

    for path in write_report(load_results(out_dir), out_dir):
        print(f"wrote {path}")
    if failed:
        print(f"targets missed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
