"""A search worker's stops (issue 48 items 6 and 7) and what a search's submission says (item 10). No trial trains
here: the worker's training is replaced by a recorder, the stop comes as the signal handler's flag."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from contract.errors import EXIT_STOPPED
from contract.search import layout
from contract.search.optuna_objects import create_study


def lr_search(sweep_dir: Path, n_trials: int = 3) -> layout.SearchSpec:
    spec = layout.SearchSpec(
        study_name="s", storage="", params={"optim.lr": {"type": "float", "low": 1e-5, "high": 1.0, "log": True}},
        overrides=[], metric="val/val/loss", higher_is_better=False, pruner={"name": "none", "min_resource": 10},
        sampler={"name": "random", "seed": 0}, n_trials=n_trials, parallel=1, max_gpu_hours=None, timeout=None,
        max_steps=30, ranks=1, cwd=str(sweep_dir), command="", created=time.time())
    layout.save_spec(sweep_dir, spec)
    create_study(sweep_dir, spec)
    return spec


@pytest.fixture
def restored_signals():  # type: ignore[no-untyped-def]
    """Worker.run installs its handlers in this process: put pytest's back."""
    sigs = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    before = {sig: signal.getsignal(sig) for sig in sigs}
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


@pytest.mark.usefixtures("restored_signals")
@pytest.mark.parametrize("when", ["while it takes the next trial", "as its trial ends"])
def test_a_worker_asked_to_stop_between_trials_starts_no_new_one(tmp_path: Path, when: str) -> None:
    """Item 6: an scancel between two trials reached the worker while it asked the study for the next one (or while
    run_local's handlers held the signals, as the trial ended); it trained that trial anyway, 29 s past the cancel.
    It takes no new trial once a stop has been asked for, and the trial it took resumes first next time."""
    from launcher.sweeps.search_worker import Worker

    lr_search(tmp_path)
    worker = Worker(tmp_path, 0)
    trained: list[int] = []
    take = worker.take

    def take_then_stop() -> int | None:
        number = take()
        if when == "while it takes the next trial" and trained:
            worker._on_stop(signal.SIGTERM, None)
        return number

    def train(number: int) -> str:
        from optuna.trial import TrialState

        from contract.search.optuna_objects import load_study

        trained.append(number)
        load_study(tmp_path, worker.spec).tell(number, state=TrialState.PRUNED)  # ended, as Worker.tell says
        worker.save_state(None)
        if when == "as its trial ends":
            worker._stop_in_trial(signal.SIGTERM)  # what run_local's handler now tells the worker
        return "pruned"

    worker.take, worker.train = take_then_stop, train  # type: ignore[method-assign]
    assert worker.run() == EXIT_STOPPED
    assert trained == [0]
    if when == "while it takes the next trial":
        assert layout.read_json(layout.worker_file(tmp_path, 0), {})["trial"] == 1  # its own: resumed first


def test_one_worker_is_a_plain_job_and_said_so() -> None:
    """Item 10: a 1-worker search said "submitted array 181", but submitit submits one task as a plain job: 181_0 is
    no id SLURM knows."""
    from launcher.sweeps.search_submit import submitted_line

    assert submitted_line("181", 1) == "submitted job 181: 1 search worker"
    assert submitted_line("182", 3) == "submitted array 182: 3 search workers (182_0 .. 182_2)"


def test_the_batch_shell_passes_the_preemption_signal_to_the_worker() -> None:
    """Item 7: `scancel --signal=USR1 --batch` reached the batch shell alone, whose trap said the training ranks
    checkpoint and requeue; nothing did. A worker's script keeps bash free to run its trap (srun in the background,
    waited for), and the trap passes the signal to the worker (tests/slurm/test_search.py sends it for real)."""
    from omegaconf import OmegaConf

    from launcher.compose import compose_and_plan
    from launcher.sweeps.search_submit import worker_parameters

    cfg, _ = compose_and_plan(["+cluster=local_slurm", "cluster.nodes=1"])
    setup = worker_parameters(OmegaConf.create(OmegaConf.to_container(cfg)))["setup"]
    traps = [line for line in setup if line.startswith("trap ")]
    assert len(traps) == 1 and "the training ranks" not in traps[0], traps
    assert 'kill -USR1 "$SLURMTRAIN_SRUN"' in traps[0] and "passed to the search worker" in traps[0]
    assert setup[0].startswith("srun() { command srun")


def test_the_training_jobs_batch_shell_passes_the_signal_and_says_so_truly() -> None:
    """The training job's batch shell said "got SIGUSR1; the training ranks checkpoint and requeue" to a signal
    that reached it alone (`scancel --signal=USR1 --batch`), and only once the job had ended; nothing did either.
    It now passes the signal to the ranks through srun, run in the background so that the trap runs at once, and
    says that (tests/slurm/test_cancel.py sends it for real). The script is valid bash."""
    import subprocess

    from omegaconf import OmegaConf
    from submitit.slurm.slurm import _make_sbatch_string

    from contract.rules.sbatch import executor_parameters
    from launcher.compose import compose_and_plan

    cfg, _ = compose_and_plan(["+cluster=local_slurm"])
    params = executor_parameters(OmegaConf.create(OmegaConf.to_container(cfg)))
    traps = [line for line in params["setup"] if line.startswith("trap ")]
    assert len(traps) == 1 and "passed to the training ranks: they checkpoint and requeue" in traps[0], traps
    assert "; the training ranks checkpoint and requeue" not in traps[0]
    assert params["setup"][0].startswith("srun() { command srun")
    script = _make_sbatch_string(command="python -m launcher.worker", folder="/tmp/x", **params)
    assert subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True).returncode == 0
    for hand_written in ("sbatch/single_node.sbatch", "sbatch/multi_node.sbatch"):  # the same lines, by hand
        text = (Path(__file__).resolve().parents[2] / hand_written).read_text()
        assert params["setup"][0] in text and traps[0] in text, hand_written
        assert subprocess.run(["bash", "-n", "-c", text], capture_output=True).returncode == 0
