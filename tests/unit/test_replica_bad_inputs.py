"""parallel.replica_groups refused before anything starts: one `error:` line naming the fix, exit 2, no run
directory (launcher/plan/replica_plan.py)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.conftest import ROOT, hq, launcher_env
from tests.forked_cli import run_module


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again once the block ends: nothing answers there


CASES = {
    "groups-dont-divide": (["local.nproc=4", "parallel.replica_groups=3"],
                           "parallel.replica_groups=3 does not divide the 4 data-parallel ranks"),
    "deepspeed": (["local.nproc=2", "parallel.replica_groups=2", "strategy=zero2"],
                  "does not work with strategy=zero2"),
    "unreachable-lighthouse": (["local.nproc=2", "parallel.replica_groups=2",
                                f"parallel.lighthouse=127.0.0.1:{_closed_port()}"], "does not answer"),
    "lighthouse-without-groups": (["parallel.lighthouse=127.0.0.1:29510"], "parallel.lighthouse is read only with"),
    "groups-dont-divide-dp-under-tp": (["local.nproc=4", "parallel.replica_groups=4", "parallel.tp=2",
                                        "model.tie_embeddings=false"],
                                       "parallel.replica_groups=4 does not divide the 2 data-parallel ranks"),
    "ep-wider-than-a-group": (["local.nproc=4", "parallel.replica_groups=2", "model=moe_tiny", "parallel.ep=4"],
                              "parallel.ep=4 does not divide a replica group's 2 data-parallel ranks"),
    "ep-wider-than-one-rank-groups": (["local.nproc=4", "parallel.replica_groups=4", "model=moe_tiny", "parallel.ep=2"],
                                      "pick an ep that divides 1, or fewer parallel.replica_groups"),
    "diloco-without-groups": (["optim.outer=diloco"], "set parallel.replica_groups=N"),
    "diloco-sync-every-zero": (["local.nproc=2", "parallel.replica_groups=2", "optim.outer=diloco",
                                "optim.sync_every=0"], "optim.sync_every=0"),
    "diloco-unsynced-tail": (["local.nproc=2", "parallel.replica_groups=2", "optim.outer=diloco",
                              "optim.sync_every=10", "trainer.max_steps=25"], "set trainer.max_steps=30 or 20"),
    "sync-every-without-diloco": (["local.nproc=2", "parallel.replica_groups=2", "optim.sync_every=10"],
                                  "set optim.outer=diloco"),
    "unknown-outer": (["local.nproc=2", "parallel.replica_groups=2", "optim.outer=lookahead"],
                      "is not one of none, diloco"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_in_one_line(case: str, tmp_path: Path) -> None:
    args, expect = CASES[case]
    root = tmp_path / "runs"
    out = run_module("launcher", [*args, "logger.backend=none", f"run.root={hq(root)}"], ROOT, launcher_env())
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(errors) == 1 and expect in errors[0], out.stderr[-2000:]
    assert not root.exists()
