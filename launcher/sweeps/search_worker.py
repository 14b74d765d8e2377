"""One worker of a search (launcher/sweeps/search.py starts search.parallel of them: SLURM array tasks or local
processes):

    python -m launcher.sweeps.search_worker SWEEP_DIR INDEX

It loops: take a trial (its own interrupted one first, then one left running by a worker that is gone, else ask the
study for a new one while the budget allows) -> train it in its own run directory, a normal run on this node
(launcher/run/local.py: one process per rank) that reports its metric to the study at each evaluation and is pruned
there (train/search/) -> tell the study how it ended. A trial that crashes is told failed, with its reason, and the
worker goes on. A preemption signal (USR1) makes the trial checkpoint; under SLURM the worker then requeues its array
task and, started again, resumes that same trial (its state file, contract/search/layout.py, names it). SIGTERM (an
scancel, Ctrl-C) checkpoints the trial and stops; the same search command resumes it.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from contract.errors import EXIT_KILLED, EXIT_STOPPED, ConfigError
from contract.rundir import ckpt_layout
from contract.rundir.events import read_events
from contract.search import layout
from contract.search.optuna_objects import distributions, load_study
from contract.search.progress import steady_step_seconds, steps_trained

# Tests only: "TRIAL:STEP" makes trial TRIAL's first attempt send this worker the preemption signal after STEP
# (train/faults/preemption.py's TEST_SIGNAL_ENV with its `parent` target): a USR1 in mid-trial, at a known step.
TEST_SEARCH_SIGNAL_ENV = "SLURMTRAIN_TEST_SEARCH_SIGNAL"
TEST_SIGNAL_ENV = "SLURMTRAIN_TEST_SIGNAL"


class Worker:
    def __init__(self, sweep_dir: Path, index: int) -> None:
        self.sweep_dir, self.index = Path(sweep_dir).resolve(), index
        self.spec = layout.load_spec(self.sweep_dir)
        self.preempted = False  # the preemption signal (USR1): checkpoint, requeue under SLURM
        self.stopping = False  # SIGTERM / SIGINT: checkpoint and stop
        self.in_trial = False

    # ---- signals: flags only; during a trial launcher/run/local.py forwards them to the ranks
    def install(self) -> None:
        signal.signal(signal.SIGUSR1, self._on_preempt)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_stop)

    def _on_preempt(self, signum: int, frame: FrameType | None) -> None:
        self.preempted = True
        if self.in_trial:
            signal.raise_signal(signal.SIGTERM)  # run_local's handler: the ranks checkpoint and stop

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def _stop_in_trial(self, signum: int) -> None:
        """run_local's handlers hold the stop signals during a trial: the flag is set all the same."""
        self.stopping = True

    def stop_asked(self) -> bool:
        return self.preempted or self.stopping

    # ---- the loop
    def run(self) -> int:
        os.chdir(self.spec.cwd)
        self.install()
        while not self.stop_asked():
            number = self.take()
            if number is None:
                return 0
            if self.stop_asked():  # asked while it took the trial: this worker's own, the next worker resumes it
                print(f"search worker {self.index}: stop asked: trial {number} is not started", file=sys.stderr)
                break
            ended = self.train(number)
            if ended == "interrupted":
                break
        return self.interrupted()

    def interrupted(self) -> int:
        task = slurm_task()
        if self.preempted and task is not None:
            # Ends this task (SLURM signals it again): its state file names the trial the requeued task resumes.
            print(f"search worker {self.index}: preempted: requeueing {task}", file=sys.stderr, flush=True)
            from contract.container.requeue import ask_host

            if ask_host(task):  # inside a container: the batch shell requeues once srun returns
                return 0
            out = subprocess.run(["scontrol", "requeue", task], capture_output=True, text=True, timeout=120)
            if out.returncode != 0:
                print(f"search worker {self.index}: scontrol requeue {task} failed: {out.stderr.strip()}; the same "
                      "search command resumes the trial", file=sys.stderr)
            return 0
        return EXIT_STOPPED

    def take(self) -> int | None:
        """Under the ask lock: this worker's own interrupted trial, else one left behind, else a new one."""
        from optuna.trial import TrialState

        self.sweep_dir.joinpath(layout.ASK_LOCK).touch()
        with open(self.sweep_dir / layout.ASK_LOCK) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            study = load_study(self.sweep_dir, self.spec)
            trials = study.get_trials(deepcopy=False)
            for t in trials:  # asked, and the ask failed before it gave every value (a sampler that raised)
                if t.state == TrialState.RUNNING and set(t.params) != set(self.spec.params):
                    study._storage.set_trial_user_attr(t._trial_id, "reason", "its values were never drawn (the "
                                                       "sampler failed while asking): not trained")
                    study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            trials = study.get_trials(deepcopy=False)
            running = {t.number for t in trials if t.state == TrialState.RUNNING}
            own = layout.read_json(layout.worker_file(self.sweep_dir, self.index), {}).get("trial")
            number: int | None = own if own in running else None
            if number is None:
                left = layout.read_json(self.sweep_dir / layout.RESUME_FILE, [])
                number = next((n for n in left if n in running), None)
                if number is not None:
                    layout.write_json(self.sweep_dir / layout.RESUME_FILE, [n for n in left if n != number])
            if number is None and self.budget_left(trials):
                study = load_study(self.sweep_dir, self.spec, asked_before=len(trials))
                trial = study.ask(distributions(self.spec))
                number = trial.number
                run_dir = layout.trial_dir(self.sweep_dir, number)
                for key, value in {"run_dir": str(run_dir), "max_steps": self.spec.max_steps,
                                   "ranks": self.spec.ranks, "seconds": 0.0, "steps": 0}.items():
                    trial.set_user_attr(key, value)
            self.save_state(number)
            return number

    def budget_left(self, trials: list[Any]) -> bool:
        if len(trials) >= self.spec.n_trials:
            return False
        if self.spec.timeout is not None and time.time() - self.spec.created >= self.spec.timeout:
            print(f"search worker {self.index}: search.timeout={self.spec.timeout:g} s reached: no new trial",
                  file=sys.stderr)
            return False
        if self.spec.max_gpu_hours is not None:
            used = sum(float(t.user_attrs.get("seconds", 0)) * int(t.user_attrs.get("ranks", 1)) for t in trials) / 3600
            if used >= self.spec.max_gpu_hours:
                print(f"search worker {self.index}: {used:.3g} of search.max_gpu_hours={self.spec.max_gpu_hours:g} "
                      "used: no new trial", file=sys.stderr)
                return False
        return True

    def save_state(self, number: int | None) -> None:
        layout.write_json(layout.worker_file(self.sweep_dir, self.index),
                          {"trial": number, "pid": os.getpid(), "host": socket.gethostname(), "job": slurm_task()})

    # ---- one trial
    def train(self, number: int) -> str:
        """Trains trial `number` (or resumes it) and tells the study how it ended: complete, pruned, failed; or
        'interrupted' (checkpointed, still RUNNING)."""
        from launcher.run.local import run_local

        study = load_study(self.sweep_dir, self.spec)
        frozen = study.get_trials(deepcopy=False)[number]
        run_dir = layout.trial_dir(self.sweep_dir, number)
        print(f"search worker {self.index}: trial {number} ({label(frozen.params)}): "
              f"{'resumes' if ckpt_layout.latest_complete_checkpoint(run_dir) else 'starts'} in {run_dir}",
              file=sys.stderr, flush=True)
        try:
            config_path, nproc = self.prepare(number, frozen.params, frozen._trial_id, run_dir)
        except ConfigError as err:
            return self.tell(study, number, run_dir, "fail", reason=str(err))
        except Exception as err:  # a trial that can't be prepared fails alone; the worker goes on
            return self.tell(study, number, run_dir, "fail", reason=f"{type(err).__name__}: {' '.join(str(err).split())}")
        if self.stop_asked():  # asked while the trial was prepared: nothing trained, it resumes with the worker
            return "interrupted"
        started = time.time()
        test_hook = self.test_signal(number, run_dir)
        self.in_trial = True
        try:
            code = run_local(config_path, nproc, handled=(signal.SIGINT, signal.SIGTERM, signal.SIGHUP),
                             on_signal=self._stop_in_trial)
        finally:
            self.in_trial = False
            if test_hook:
                os.environ.pop(TEST_SIGNAL_ENV, None)
        self.account(study, number, run_dir, time.time() - started)
        if code in (EXIT_STOPPED, EXIT_KILLED) or self.preempted or self.stopping and code != 0:
            print(f"search worker {self.index}: trial {number} checkpointed and stopped: it resumes with the worker",
                  file=sys.stderr)
            return "interrupted"
        if code != 0:
            return self.tell(study, number, run_dir, "fail", reason=failure_reason(run_dir, code))
        ends = [e for e in read_events(run_dir) if e.get("kind") in ("pruned", "finished")]
        if ends and ends[-1]["kind"] == "pruned":
            return self.tell(study, number, run_dir, "pruned")
        return self.tell(study, number, run_dir, "complete")

    def prepare(self, number: int, params: dict[str, Any], trial_id: int, run_dir: Path) -> tuple[Path, int]:
        """The trial's config: the search's base with the trial's values, in its own run directory, run here as a
        local run (one process per rank of the node this worker holds). Written as any run's (config.yaml,
        command.txt, plan.json) plus trial.json."""
        from contract.config.schema import Config
        from launcher.checks.overrides import typed_as
        from launcher.plan.launch_plan import make_plan
        from launcher.run import rundir
        from launcher.sweeps.search_space import override

        base = OmegaConf.load(self.sweep_dir / layout.BASE_CONFIG)
        cfg: DictConfig = OmegaConf.merge(OmegaConf.structured(Config), base)  # type: ignore[assignment]
        values = [override(k, v) for k, v in params.items()]
        with open_dict(cfg):
            for key, value in params.items():
                OmegaConf.update(cfg, key, value, merge=False)
            cfg.run.root, cfg.run.name = str(run_dir.parent), run_dir.name
            cfg.run.resume, cfg.run.overwrite = True, False
            if self.spec.pruner["name"] != "none" and self.spec.pruner.get("min_improvement"):
                cfg.eval.at_start = True  # the untrained model's value: a trial that does not improve on it is pruned
            if cfg.cluster is not None:  # inside this worker's allocation: its ranks are local processes
                cfg.local.nproc = self.spec.ranks
                cfg.cluster = None
        with typed_as([*self.spec.overrides, *values]):
            plan = make_plan(cfg)
        if plan.refusal:
            raise ConfigError(plan.refusal)
        argv = ["launcher", *self.spec.overrides, *values, f"run.root={run_dir.parent}", f"run.name={run_dir.name}"]
        config_path = rundir.prepare(cfg, plan.run_dir, argv=argv, plan=plan)
        layout.write_json(run_dir / layout.TRIAL_FILE, {"sweep_dir": str(self.sweep_dir), "number": number,
                                                        "trial_id": trial_id, "every": int(cfg.eval.every),
                                                        "max_steps": int(plan.max_steps or cfg.trainer.max_steps)})
        return config_path, plan.world_size

    def test_signal(self, number: int, run_dir: Path) -> bool:
        spec = os.environ.get(TEST_SEARCH_SIGNAL_ENV, "")
        if not spec or int(spec.split(":")[0]) != number or ckpt_layout.latest_complete_checkpoint(run_dir):
            return False
        os.environ[TEST_SIGNAL_ENV] = f"{spec.split(':')[1]}:0:parent"
        return True

    def account(self, study: Any, number: int, run_dir: Path, seconds: float) -> None:
        trial_id = study.get_trials(deepcopy=False)[number]._trial_id
        before = float(study.get_trials(deepcopy=False)[number].user_attrs.get("seconds", 0.0))
        study._storage.set_trial_user_attr(trial_id, "seconds", before + seconds)
        study._storage.set_trial_user_attr(trial_id, "steps", steps_trained(run_dir))
        step_s = steady_step_seconds(run_dir)
        if step_s is not None:
            study._storage.set_trial_user_attr(trial_id, "step_s", step_s)

    def tell(self, study: Any, number: int, run_dir: Path, how: str, reason: str = "") -> str:
        import optuna
        from optuna.trial import TrialState

        if self.spec.sampler["name"] == "grid":
            # The grid sampler stops the study when its grid is told complete, which Optuna allows only inside
            # study.optimize; the workers count the trials themselves (search.n_trials is capped at the grid's size).
            study.sampler = optuna.samplers.RandomSampler()
        frozen = study.get_trials(deepcopy=False)[number]
        values = frozen.intermediate_values
        if how == "complete" and not values:
            how, reason = "fail", f"the trial never reported {self.spec.metric}"
        if how == "complete":
            study.tell(number, values[max(values)])
        elif how == "pruned":
            study.tell(number, state=TrialState.PRUNED)
        else:
            study._storage.set_trial_user_attr(frozen._trial_id, "reason", reason)
            study.tell(number, state=TrialState.FAIL)
        print(f"search worker {self.index}: trial {number} {how}" + (f": {reason}" if reason else ""),
              file=sys.stderr, flush=True)
        self.save_state(None)
        return how


def label(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def failure_reason(run_dir: Path, code: int) -> str:
    """The one line that says why: the rank's `error:` line, else the last line of its log, else the exit code."""
    try:
        lines = [ln.strip() for ln in (run_dir / "logs" / "rank_0.log").read_text(errors="replace").splitlines()
                 if ln.strip()]
    except OSError:
        lines = []
    errors = [ln for ln in lines if "error" in ln.lower()]
    line = errors[-1] if errors else (lines[-1] if lines else "")
    return f"exit code {code}" + (f": {line[-300:]}" if line else "")


def slurm_task() -> str | None:
    """This worker's array task (the job, for an array of one), None outside SLURM."""
    if os.environ.get("SLURM_ARRAY_JOB_ID") and os.environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def work(sweep_dir: str, index: int) -> int:
    """What a SLURM array task runs (submitit pickles it): worker `index` of the search in `sweep_dir`."""
    return Worker(Path(sweep_dir), index).run()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m launcher.sweeps.search_worker SWEEP_DIR INDEX", file=sys.stderr)
        return 2
    return work(args[0], int(args[1]))


if __name__ == "__main__":
    sys.exit(main())
