"""container=... for real (issue 45's acceptance): the same fsdp job, in each runtime here, trains the same losses as
the job outside any container, bit for bit; under pyxis a SIGUSR1 mid-run checkpoints, requeues (the batch shell
does it: the image has no scontrol) and resumes exactly in the container the first attempt unpacked; a sweep, a
search, a `launcher.prepare` array and a +remote submission run in the image; a version mismatch inside the image is
one line and exit 2.

The runs share one reference (local, 2 ranks, no container). The image is `make containers-up`'s: its interpreter,
/usr/bin/python3 there, has torch and this machine's /usr/bin/python3 has not, so a run that trains ran in the
image. Each run's plan line says which slurmtrain it ran (the image's own, or this checkout mounted over it when the
working tree is ahead of the image).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import hq, launch, launcher_env, read_metrics
from tests.containers.conftest import ContainerImages, need_runtime
from tests.slurm.helpers import assert_on_two_nodes, preempt_and_release, submitted_job_id, wait_terminal

STEPS = 60
JOB = ["strategy=fsdp", f"trainer.max_steps={STEPS}", "trainer.log_every=1", "trainer.ckpt_every=0",
       "logger.backend=none", "telemetry.enabled=false"]


def image_args(runtime: str, images: ContainerImages) -> list[str]:
    image = {"charliecloud": images.directory, "enroot": images.squashfs, "pyxis": images.squashfs,
             "podman": images.podman}[runtime]
    return [f"container={runtime}", f"container.image={hq(image)}", f"container.python={images.python}"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Under /tmp, which Charliecloud's ch-run shares with the host (it binds only onto directories the image has).
    return tmp_path_factory.mktemp("containers")


@pytest.fixture(scope="module")
def reference(root: Path) -> list[float]:
    """The job's losses outside any container: 2 local ranks."""
    out = launch(*JOB, "local.nproc=2", f"run.root={hq(root)}", "run.name=bare", cwd=root, USER="root")
    assert out.returncode == 0, out.stderr[-3000:]
    return [r["loss"] for r in read_metrics(root / "bare")]


def losses(run_dir: Path) -> list[float]:
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # every step exactly once
    return [r["loss"] for r in rows]


def test_charliecloud_local_ranks_train_as_outside(root: Path, reference: list[float]) -> None:
    images = need_runtime("charliecloud")
    out = launch(*JOB, *image_args("charliecloud", images), "local.nproc=2", f"run.root={hq(root)}",
                 "run.name=local_cc", cwd=root, USER="root")
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"container: charliecloud {images.directory}; runs " in out.stderr
    assert losses(root / "local_cc") == reference
    config = yaml.safe_load((root / "local_cc" / "config.yaml").read_text())
    assert config["container"]["code"] in ("image", "checkout") and str(root) in config["container"]["auto_mounts"]


def test_pyxis_preempted_requeues_and_resumes_exactly(root: Path, reference: list[float]) -> None:
    images = need_runtime("pyxis")
    out = launch("+cluster=local_slurm", *JOB, *image_args("pyxis", images), f"run.root={hq(root)}",
                 "run.name=pyxis", cwd=root, USER="root")
    assert out.returncode == 0, out.stderr[-3000:]
    job_id = submitted_job_id(out.stdout)
    run_dir = root / "pyxis"
    script = (run_dir / "sbatch.sh").read_text()
    assert f"--container-image={images.squashfs}" in script and "--container-name=slurmtrain-" in script
    assert preempt_and_release(job_id, run_dir) == "COMPLETED"
    history = subprocess.run(["sacct", "-j", job_id, "-D", "-X", "-n", "-o", "State"], capture_output=True,
                             text=True).stdout.split()
    assert "REQUEUED" in history and history[-1] == "COMPLETED", history
    log = "".join(p.read_text() for p in sorted((run_dir / "slurm").glob(f"{job_id}_*log.err")))
    assert f"batch shell: requeueing job {job_id} as a rank asked" in log
    assert_on_two_nodes(log)  # a 2-node job: one container per node
    assert re.search(r"resumed from .*step_\d+: step (\d+)", log), log[-3000:]
    assert losses(run_dir) == reference
    assert_requeued_attempt_reused_the_container(job_id)


def assert_requeued_attempt_reused_the_container(job_id: str) -> None:
    """pyxis logs, in each node's slurmd log, whether a step unpacked the named container or reused it: every node of
    the requeued attempt reused it (pyxis's container_scope=global, this cluster's: the first attempt's container
    outlives the attempt; docs/containers.md)."""
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    pattern = re.search(r"^SlurmdLogFile\s*=\s*(\S+)", config, re.M)
    assert pattern, "the local cluster's slurmd logs to a file (scripts/slurm/up.sh)"
    attempts = subprocess.run(["sacct", "-j", job_id, "-D", "-X", "-n", "-P", "-o", "Start,NNodes"],
                              capture_output=True, text=True).stdout.split()
    requeued_start, nodes = attempts[-1].split("|")
    seen = re.compile(rf"^\[(\S+)\] \[{job_id}\.0\] pyxis: (reusing existing|creating) container filesystem", re.M)
    lines = [m.groups() for path in Path("/").glob(pattern.group(1).lstrip("/").replace("%n", "*"))
             for m in seen.finditer(path.read_text(errors="replace"))]
    second = [how for at, how in lines if at >= requeued_start]
    assert second == ["reusing existing"] * int(nodes), (requeued_start, lines)
    assert len(lines) >= 2 * int(nodes), lines  # the first attempt's too


@pytest.mark.parametrize("runtime", ["enroot", "charliecloud", "podman"])
def test_each_runtime_on_slurm_trains_as_outside(root: Path, reference: list[float], runtime: str) -> None:
    images = need_runtime(runtime)
    out = launch("+cluster=local_slurm", *JOB, *image_args(runtime, images), f"run.root={hq(root)}",
                 f"run.name=slurm_{runtime}", "launcher.wait=true", cwd=root, USER="root", timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert losses(root / f"slurm_{runtime}") == reference


def test_a_preparation_array_runs_in_the_image(root: Path) -> None:
    """python -m launcher.prepare's array and finalize job in Charliecloud on the local cluster (training's
    container= group and keys): its dataset is byte-identical to a local preparation's."""
    from tests.unit.test_prepare import _build_corpus, _tree, prepare

    images = need_runtime("charliecloud")
    _build_corpus(root / "corpus")
    args = [str(root / "corpus"), "--tokenizer", "bytes", "--val-fraction", "0.3", "--task-mb", "0.003"]
    out = root / "prepared in image"
    submitted = subprocess.run([sys.executable, "-m", "launcher.prepare", *args, "--out", str(out),
                                "+cluster=local_slurm", *image_args("charliecloud", images)],
                               capture_output=True, text=True, timeout=300, cwd=root, env=launcher_env(USER="root"))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    assert f"container: charliecloud {images.directory}; runs " in submitted.stdout
    match = re.search(r"array (\d+) \((\d+) tasks?.*finalize job (\d+)", submitted.stdout)
    assert match and int(match.group(2)) >= 2, submitted.stdout
    assert wait_terminal(match.group(3), timeout=300) == "COMPLETED", submitted.stdout
    scripts = [p.read_text() for p in (out / ".parts" / "slurm").glob("*_submission.sh")]
    assert len(scripts) == 2 and all(f"{images.directory} -- {images.python} -u -m submitit" in s for s in scripts)
    assert prepare(*args, "--out", root / "prepared here")[0] == 0
    there, here = _tree(out), _tree(root / "prepared here")
    assert {k: v for k, v in there.items() if not k.startswith(".parts/")} == {
        k: v for k, v in here.items() if not k.startswith(".parts/")}


def test_a_sweep_and_a_search_run_in_the_image(root: Path) -> None:
    images = need_runtime("charliecloud")
    cc = image_args("charliecloud", images)
    short = ["trainer.max_steps=20", "logger.backend=none", "telemetry.enabled=false", "+cluster=local_slurm",
             "cluster.nodes=1", f"run.root={hq(root)}"]
    sweep = launch("-m", "optim.lr=1e-3,3e-3", *short, *cc, "launcher.sweep_name=cc_sweep", "launcher.wait=true",
                   cwd=root, USER="root", timeout=600)
    assert sweep.returncode == 0, sweep.stdout[-2000:] + sweep.stderr[-3000:]
    assert "2 of 2 jobs completed" in sweep.stderr
    script = next((root / "sweeps" / "cc_sweep" / "slurm").glob("*_submission.sh")).read_text()
    assert "ch-run " in script and str(images.directory) in script
    search = launch("-m", "hydra/sweeper=search", "optim.lr=tag(log,interval(1e-3,3e-2))", "search.n_trials=3",
                    "search.parallel=1", "eval.every=10", *short, *cc, "launcher.sweep_name=cc_search",
                    "launcher.wait=true", cwd=root, USER="root", timeout=900)
    assert search.returncode == 0, search.stdout[-2000:] + search.stderr[-3000:]
    from contract.search import layout
    from contract.search.optuna_objects import load_study

    sweep_dir = root / "sweeps" / "cc_search"
    trials = load_study(sweep_dir, layout.load_spec(sweep_dir)).get_trials(deepcopy=False)
    states = [t.state.name for t in trials]  # a trial the pruner stopped ended as it should
    assert len(trials) == 3 and set(states) <= {"COMPLETE", "PRUNED"} and "COMPLETE" in states, states
    worker_log = "".join(p.read_text() for p in (sweep_dir / "slurm").glob("*_log.err"))
    assert "ch-run" not in worker_log  # the worker's trials start directly: the worker is inside the image already


def test_remote_submission_runs_its_snapshot_in_the_image(tmp_path: Path) -> None:
    from tests.slurm.remote_helpers import SSHD_DIR, require_login_node

    require_login_node()
    images = need_runtime("pyxis")
    name = "container_remote"
    # The login node's work directory outlives a suite: a run left there by an earlier one would only be resumed.
    shutil.rmtree(SSHD_DIR / "work" / "outputs" / name, ignore_errors=True)
    out = launch("+remote=local_sshd", "+cluster=local_slurm", "trainer.max_steps=10", "logger.backend=none",
                 *image_args("pyxis", images), f"run.name={name}", "launcher.wait=true", cwd=tmp_path,
                 USER="root", timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "submitted job" in out.stdout and "finished at step 10" in out.stdout + out.stderr
    run_dir = SSHD_DIR / "work" / "outputs" / name
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    snapshot = json.loads((run_dir / "environment.json").read_text())["snapshot"]["path"]
    assert config["container"]["runtime"] == "pyxis"
    assert any(snapshot == m or snapshot.startswith(m.rstrip("/") + "/") for m in config["container"]["auto_mounts"])
    assert f"--container-workdir={snapshot}" in (run_dir / "sbatch.sh").read_text()
    assert wait_terminal((run_dir / "jobs.txt").read_text().split()[-1]) == "COMPLETED"


def test_a_slurmtrain_version_mismatch_inside_the_image_is_one_line(tmp_path: Path) -> None:
    """A slurmtrain 9.9 shadows the image's (its metadata first on the image's PYTHONPATH): with container.code=image
    the launch is refused before anything is created."""
    images = need_runtime("charliecloud")
    fake = tmp_path / "site"
    (fake / "slurmtrain-9.9.dist-info").mkdir(parents=True)
    (fake / "slurmtrain-9.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: slurmtrain\nVersion: 9.9\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    out = launch(*image_args("charliecloud", images), "container.code=image", f"+container.env.PYTHONPATH={fake}",
                 "trainer.max_steps=2", "logger.backend=none", f"run.root={hq(tmp_path / 'runs')}", cwd=tmp_path,
                 USER="root", XDG_CACHE_HOME=str(tmp_path / "cache"))
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith(f"error: slurmtrain inside {images.directory} is 9.9, this launcher is ")
    assert "container.code=checkout" in lines[0] or "install this version" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "cache") == before
