"""make bench: every benchmark, each reported as ratios measured within one run, results under bench/results/."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
BENCHMARKS = {
    "checkpoint_stall": "bench.checkpoint_stall",
    "submit_latency": "bench.submit_latency",
    "memory_estimate": "bench.memory_estimate",
    "telemetry_overhead": "bench.telemetry_overhead",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", default=list(BENCHMARKS), help=f"subset of {', '.join(BENCHMARKS)}")
    args = parser.parse_args(argv)
    RESULTS.mkdir(exist_ok=True)
    failed = []
    for name in args.names:
        import importlib

        module = importlib.import_module(BENCHMARKS[name])
        result = module.run()
        (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
        print(module.report(result))
        if not result.get("target_met", True):
            failed.append(name)
    if failed:
        print(f"targets missed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
