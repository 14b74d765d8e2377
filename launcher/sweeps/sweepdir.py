"""The sweep directory: what a Hydra multirun sweep submitted, where each point trains, which arrays ran it.

    RUN_ROOT/sweeps/<sweep name>/
        sweep.json      the record below (rewritten atomically after every submission)
        multirun.yaml   Hydra's own record of the sweep config
        slurm/          submitit's folder for the arrays: <ARRAY>_<TASK>_<RANK>_log.{out,err}, pickles

Each point trains in the run directory it would have as a single run (RUN_ROOT/<run name>), so the same command
for one point resumes it, and `python -m launcher.status` / `report` read the points from here.

sweep.json:
    {"name": str, "command": str (the exact sweep command), "swept": [override keys that vary],
     "points": [{"index": int, "overrides": [str], "run_dir": str, "jobs": [array task ids, oldest first]}],
     "arrays": [{"array_id": str, "points": [int], "resources": str, "submitted": ISO time}]}

Pure stdlib: read on login nodes by the status and report tools.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launcher.checks.overrides import override_key

SWEEP_FILE = "sweep.json"


@dataclass
class Point:
    index: int
    overrides: list[str]
    run_dir: str
    # Every SLURM array task id this point was given, oldest first (a resumed sweep appends a new one).
    jobs: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return " ".join(self.overrides) or f"point {self.index}"


@dataclass
class Array:
    array_id: str
    points: list[int]
    resources: str
    submitted: str


@dataclass
class Sweep:
    name: str
    command: str
    swept: list[str]
    points: list[Point]
    arrays: list[Array] = field(default_factory=list)

    def point_label(self, point: Point) -> str:
        return swept_label(point.overrides, self.swept) or point.label


def swept_label(overrides: list[str], swept: list[str]) -> str:
    """The swept values only (what tells the points apart), e.g. `optim.lr=1e-4 strategy=fsdp`."""
    keys = set(swept)
    return " ".join(o for o in overrides if override_key(o) in keys)


def is_sweep_dir(path: Path) -> bool:
    return (Path(path) / SWEEP_FILE).is_file()


def load_sweep(sweep_dir: Path) -> Sweep:
    data: dict[str, Any] = json.loads((Path(sweep_dir) / SWEEP_FILE).read_text())
    return Sweep(
        name=data["name"], command=data["command"], swept=list(data.get("swept", [])),
        points=[Point(**p) for p in data["points"]], arrays=[Array(**a) for a in data.get("arrays", [])],
    )


def save_sweep(sweep_dir: Path, sweep: Sweep) -> Path:
    path = Path(sweep_dir) / SWEEP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(sweep), indent=2) + "\n")
    os.replace(tmp, path)
    return path
