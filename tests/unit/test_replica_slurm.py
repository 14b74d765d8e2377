"""Replica groups on SLURM without a job (launcher/plan/replica_slurm_plan.py, launcher/run/replica_slurm.py,
train/replicas/peers.py, train/replicas/task_end.py): the plan's array and lighthouse lines, the scripts a dry run
writes, the refusals (one `error:` line, exit 2, nothing submitted), and the lighthouse status the heal decision reads."""

from __future__ import annotations

import datetime
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, hq, launcher_env
from tests.forked_cli import run_module

GROUPS = ["+cluster=local_slurm", "cluster.nodes=3", "cluster.tasks_per_node=2", "parallel.replica_groups=3",
          "strategy=fsdp", "logger.backend=none", "trainer.max_steps=20"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dry(root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_module("launcher", [*GROUPS, *extra, "launcher.dry_run=true", f"run.root={hq(root)}", "run.name=g"],
                      ROOT, launcher_env())


def test_a_dry_run_shows_the_array_and_the_lighthouse_job(tmp_path: Path) -> None:
    out = _dry(tmp_path / "runs")
    assert out.returncode == 0, out.stderr[-3000:]
    assert ("job array of 3 tasks (task k = replica group k), each 1 node(s) x 2 rank(s); a group whose rank fails "
            "is ended whole by srun and its task requeues alone") in out.stderr
    assert "lighthouse a job of its own (1 task, 1 CPU), submitted first; the array starts once it runs" in out.stderr
    run_dir = tmp_path / "runs" / "g"
    array = (run_dir / "sbatch.dry_run.sh").read_text()
    for line in ("#SBATCH --array=0-2%3", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=2",
                 "#SBATCH --dependency=after:LIGHTHOUSE_JOB", "#SBATCH --requeue",
                 "export SLURMTRAIN_REPLICA_GROUP=$SLURM_ARRAY_TASK_ID SLURMTRAIN_REPLICA_GROUPS=3",
                 "--kill-on-bad-exit=1", "-m launcher.worker --group-ended", '(exit "$srun_code")'):
        assert line in array, (line, array)
    # the teardown comes after srun, and hands srun's code on as the script's own
    assert array.index("submitit.core._submit") < array.index("--group-ended") < array.rindex('(exit "$srun_code")')
    beacon = (run_dir / "lighthouse.dry_run.sh").read_text()
    assert "#SBATCH --ntasks=1" in beacon and "-m launcher.run.lighthouse_keeper" in beacon
    assert not (run_dir / "config.yaml").exists()  # nothing prepared, nothing submitted


@pytest.mark.parametrize(("inner", "layout", "ranks"), [
    (["parallel.tp=2", "model.tie_embeddings=false"], "(each: tp 2 x dp 1)", 2),
    (["cluster.tasks_per_node=4", "parallel.pp=2", "model.tie_embeddings=false", "trainer.micro_batch_size=1",
      "trainer.grad_accum_steps=8"], "(each: pp 2 x dp 2)", 4),
    (["cluster.tasks_per_node=4", "model=moe_tiny", "parallel.ep=2"], "(each: dp 4, the experts split over ep 2)", 4),
], ids=["tp", "pp", "ep"])
def test_a_group_holds_whole_model_parallel_blocks(inner: list[str], layout: str, ranks: int, tmp_path: Path) -> None:
    """Model parallelism inside each group: the plan names a group's layout, and the array's tasks hold all of a
    group's ranks, not only its data-parallel ones."""
    out = _dry(tmp_path / "runs", *inner)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"replica groups: 3 of {ranks} rank(s) {layout}, each its own process group" in out.stderr, out.stderr
    assert f"job array of 3 tasks (task k = replica group k), each 1 node(s) x {ranks} rank(s)" in out.stderr
    assert f"#SBATCH --ntasks-per-node={ranks}" in (tmp_path / "runs" / "g" / "sbatch.dry_run.sh").read_text()


def test_lighthouse_login_is_on_this_host_and_no_job(tmp_path: Path) -> None:
    out = _dry(tmp_path / "runs", "parallel.lighthouse=login")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "lighthouse started on this login node by the launcher and kept until the array ends" in out.stderr
    run_dir = tmp_path / "runs" / "g"
    assert "--dependency" not in (run_dir / "sbatch.dry_run.sh").read_text()
    assert not (run_dir / "lighthouse.dry_run.sh").exists()


REFUSED = {
    "unreachable-lighthouse": ([*GROUPS, f"parallel.lighthouse=127.0.0.1:{_closed_port()}"], "does not answer"),
    "nodes-dont-split": ([*GROUPS, "cluster.nodes=1", "parallel.replica_groups=2"],  # 2 ranks, one node
                         "cluster.nodes=1 does not split into 2: set cluster.nodes to a multiple of 2"),
    # 3 ranks don't divide into 2 groups either, but the fix is cluster.nodes, not local.nproc (a new user's trial).
    "nodes-dont-split-three": ([*GROUPS, "cluster.tasks_per_node=1", "parallel.replica_groups=2"],
                               "cluster.nodes=3 does not split into 2: set cluster.nodes to a multiple of 2"),
    "login-without-cluster": (["local.nproc=3", "parallel.replica_groups=3", "logger.backend=none",
                               "parallel.lighthouse=login"],
                              "parallel.lighthouse=login starts the lighthouse on the login node of a SLURM run"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_in_one_line_and_nothing_submitted(case: str, tmp_path: Path) -> None:
    args, expect = REFUSED[case]
    root = tmp_path / "runs"
    name = f"refused-{case}-{time.monotonic_ns()}"
    out = run_module("launcher", [*args, f"run.root={hq(root)}", f"run.name={name}"], ROOT, launcher_env())
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(errors) == 1 and expect in errors[0], out.stderr[-2000:]
    assert not root.exists()
    queued = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True)
    assert queued.returncode != 0 or not queued.stdout.strip()  # no job of that name (no SLURM here: none either)


def test_live_groups_reads_the_lighthouse_heartbeats() -> None:
    coordination = pytest.importorskip("torchft.coordination")
    from train.replicas.peers import live_groups

    server = coordination.LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=100,
                                           heartbeat_timeout_ms=500)
    try:
        address = server.address()
        assert live_groups(address) == set()
        client = coordination.LighthouseClient(address, connect_timeout=datetime.timedelta(seconds=5))
        client.heartbeat("group_0:aaaa")
        client.heartbeat("group_2:bbbb")
        assert live_groups(address) == {0, 2}
        time.sleep(0.8)  # past the heartbeat timeout: the page marks them old
        client.heartbeat("group_2:cccc")
        assert live_groups(address) == {2}
    finally:
        server.shutdown()
    assert live_groups(f"127.0.0.1:{_closed_port()}") is None


def test_a_lighthouse_another_runs_groups_heartbeat_to_is_refused(tmp_path: Path) -> None:
    """A new user's trial: two runs given one parallel.lighthouse joined one quorum, averaged each other's gradients
    and both crashed in the ledger. A lighthouse where replica groups already heartbeat is refused, nothing started."""
    coordination = pytest.importorskip("torchft.coordination")
    server = coordination.LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=100,
                                           heartbeat_timeout_ms=120_000)
    try:
        address = server.address()
        coordination.LighthouseClient(address, connect_timeout=datetime.timedelta(seconds=5)).heartbeat("group_1:x")
        root = tmp_path / "runs"
        out = run_module("launcher", ["local.nproc=2", "parallel.replica_groups=2", "logger.backend=none",
                                      f"parallel.lighthouse={address}", f"run.root={hq(root)}", "run.name=second"],
                         ROOT, launcher_env())
    finally:
        server.shutdown()
    errors = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(errors) == 1, out.stderr[-2000:]
    assert "already serves another run's replica groups (group_1 heartbeat there)" in errors[0], errors[0]
    assert not (root / "second").exists()


def test_the_batch_shell_names_how_a_rank_died() -> None:
    from train.replicas.task_end import _cause

    assert _cause(137) == "a rank was killed by SIGKILL (srun exit code 137)"
    assert _cause(1) == "a rank exited with code 1 without recording why"
