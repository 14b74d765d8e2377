"""Login-node side of slurmtrain: compose, validate, plan, dispatch. Never imports torch at import time.

Importing it first makes our compute-side package `train` win over a user's own `train.py` (or `train/`) in the
working directory, which Python would otherwise find first: the launcher runs from the user's project directory,
whatever files it holds. The user's other modules stay importable from there.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent


def _prefer_our_train_package() -> None:
    ours = _ROOT / "train"
    if not (ours / "__init__.py").is_file():
        return
    loaded = sys.modules.get("train")
    try:
        spec = importlib.util.find_spec("train") if loaded is None else loaded.__spec__
    except (ImportError, ValueError):
        spec = None
    origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
    if origin is not None and ours in origin.parents:
        return
    sys.path.insert(0, str(_ROOT))
    for name in [m for m in sys.modules if m == "train" or m.startswith("train.")]:
        del sys.modules[name]


_prefer_our_train_package()
