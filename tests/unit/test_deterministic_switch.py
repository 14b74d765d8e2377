"""train.entry.deterministic_algorithms: torch's deterministic switch without importing inductor at a rank's start,
and a compiled run that imports inductor afterwards still gets inductor's deterministic mode."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
from train.entry import deterministic_algorithms
import torch
deterministic_algorithms()
before = "torch._inductor" in sys.modules
import torch._inductor.config as c
print(json.dumps({"enabled": torch.are_deterministic_algorithms_enabled(),
                  "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
                  "inductor_at_switch": before, "inductor_deterministic": c.deterministic}))
"""


def test_the_switch_is_on_warn_only_without_inductor_and_inductor_follows_it() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"enabled": True, "warn_only": True, "inductor_at_switch": False, "inductor_deterministic": True}


def test_with_inductor_already_imported_the_public_call_sets_both() -> None:
    probe = "import torch._inductor.config\n" + PROBE.replace('before = "torch._inductor" in sys.modules', "before = False")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "TORCHINDUCTOR_DETERMINISTIC": "0"})
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["enabled"] and got["warn_only"] and got["inductor_deterministic"]
