"""Every module of the login side (launcher/ and the contract it shares with train/) imports without torch,
deepspeed or wandb. import-linter (`make lint`) checks the layers between the packages, and
tests/unit/test_import_graph.py that no modules import each other in a circle."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "deepspeed", "wandb")


def launcher_modules(packages: tuple[str, ...] = ("launcher", "contract")) -> dict[str, Path]:
    """Every module under the packages, found on disk (a package added later is walked too)."""
    found = {}
    for path in sorted(p for package in packages for p in (ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def test_every_launcher_module_imports_without_torch_deepspeed_or_wandb() -> None:
    modules = launcher_modules()
    assert {"launcher.checks.key_checks", "launcher.plan.launch_plan", "launcher.run.slurm",
            "launcher.sweeps.sweep", "contract.rundir.events", "contract.config.schema", "launcher.prepare.run"} <= set(modules)
    code = ("import importlib, sys\n"
            f"for name in {sorted(modules)!r}:\n"
            "    importlib.import_module(name)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"imported at import time: {out.stdout}"
