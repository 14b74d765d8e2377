"""The trial's side of a search: RUN_DIR/trial.json (contract/search/layout.py) says which study and trial this run
is. At each evaluation rank 0 reports the metric to the study, once per step: a requeued trial that evaluates a
step again (its resume validation) finds the value recorded and does not report it twice, so the pruner sees what
it would have seen. The pruner's verdict is agreed by every rank; a pruned trial ends with a `pruned` event."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contract.search.layout import TRIAL_FILE, load_spec
from contract.search.optuna_objects import load_study
from train.distributed import DistEnv, cpu_group
from train.faults.preemption import StopOutcome, all_reduce_max_each
from train.observe.metrics import log


class TrialReporter:
    def __init__(self, run_dir: Path, env: DistEnv) -> None:
        info = json.loads((run_dir / TRIAL_FILE).read_text())
        self.env = env
        self.number, self.trial_id = int(info["number"]), int(info["trial_id"])
        spec = load_spec(Path(info["sweep_dir"]))
        self.metric = spec.metric
        self.study: Any = load_study(Path(info["sweep_dir"]), spec) if env.is_main else None
        self.group = cpu_group()
        self.value: float | None = None
        self.rule = ""  # which of the pruner's rules pruned the trial (rank 0)
        self.every, self.max_steps = int(info["every"]), int(info["max_steps"])

    @classmethod
    def open(cls, run_dir: Path, env: DistEnv) -> TrialReporter | None:
        """None for a run that is no search's trial."""
        return cls(run_dir, env) if (run_dir / TRIAL_FILE).is_file() else None

    def report(self, step: int, values: dict[str, float], decide: bool = True) -> bool:
        """Collective. Reports values[metric] at `step` (unless already recorded) and returns whether the trial is
        pruned (always False with decide=False: the validation a resume starts with)."""
        if step not in (0, self.max_steps) and step % self.every:
            return False  # a resume's validation between evaluations: not a step the trial reports (nor would have)
        pruned = 0
        if self.study is not None and self.metric in values:
            import optuna

            value = float(values[self.metric])
            self.value = value
            trial = optuna.trial.Trial(self.study, self.trial_id)
            if step not in self.study._storage.get_trial(self.trial_id).intermediate_values:
                trial.report(value, step)
            if decide:
                pruned = int(trial.should_prune())
                self.rule = str(getattr(self.study.pruner, "rule", "")) if pruned else ""
        if decide:
            pruned = all_reduce_max_each([pruned], self.group)[0]
        return bool(pruned)

    def pruned_outcome(self, step: int) -> StopOutcome:
        if self.env.is_main:
            log.info("trial %d pruned at step %d (%s %s)%s", self.number, step, self.metric,
                     "-" if self.value is None else f"{self.value:.4f}", f": {self.rule}" if self.rule else "")
        return StopOutcome(0, None, kind="pruned", details={"trial": self.number, "metric": self.metric,
                                                            "value": self.value, "rule": self.rule})
