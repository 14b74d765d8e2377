"""Every module of the login side (launcher/ and the contract it shares with train/) imports without torch,
deepspeed or wandb, and no two modules of launcher/, contract/ or train/ import each other at import time (an
import circle). import-linter (`make lint`) checks the layers between the packages."""

from __future__ import annotations

import ast
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


def _imported_at_import_time(path: Path, modules: dict[str, Path]) -> set[str]:
    """The launcher modules a module's top level imports (function-level imports are deferred: no circle)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                      for alias in node.names}
    return {name for name in names if name in modules and name not in ("launcher", "train", "contract")}


def test_no_import_circles_in_launcher_contract_or_train() -> None:
    modules = launcher_modules(("launcher", "contract", "train"))
    graph = {name: _imported_at_import_time(path, modules) for name, path in modules.items()}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        for dep in sorted(graph[name]):
            assert dep not in path, f"import circle: {' -> '.join([*path[path.index(dep):], dep])}"
            if dep not in done:
                visit(dep, [*path, dep])
        done.add(name)

    for name in sorted(graph):
        visit(name, [name])
