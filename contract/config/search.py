"""The `search` section: a hyperparameter search (`-m hydra/sweeper=search`, launcher/sweeps/search.py).

Read only by searches; a plain run or a grid sweep ignores it. Declared here, set on the command line.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.config.keys import num


@dataclass
class SearchConfig:
    # Trials in all (complete, pruned and failed together); the workers stop asking once the study has this many.
    n_trials: int = num(20, 1)
    # Workers training trials at once: one SLURM array of this many tasks, or this many local processes.
    parallel: int = num(1, 1)
    # Stops hopeless trials at an evaluation (eval.every): median | asha (successive halving) | hyperband | none.
    pruner: str = "median"
    # Which values the next trial gets: tpe | random | grid (every combination of choice()/range() values) | cmaes.
    sampler: str = "tpe"
    # The sampler's seed: the same seed and one worker give the same trials.
    seed: int = num(0, 0)
    # What the trials are compared by: a validation metric measured at every evaluation (val/NAME/loss, val/NAME/ppl,
    # harness/TASK/METRIC). None: checkpoint.keep_best's metric, else the first validation set's loss.
    metric: str | None = None
    # The pruners' first rung (asha, hyperband) or warm-up (median), in steps; None: eval.every.
    min_resource: int | None = num(None, 1)
    # asha and hyperband: a third (3) of the trials at each rung go on to the next.
    reduction_factor: int = num(3, 2)
    # From the first rung on, a trial whose metric has not improved on its untrained value (step 0) by this fraction
    # of it is pruned, whatever the pruner (a frozen or diverging run); 0: off. Not with search.pruner=none.
    min_improvement: float = num(0.01, 0, 1)
    # Where the study lives. None: Optuna's file journal in the sweep directory (no database server, works on a
    # shared filesystem); or an RDB URL (sqlite:///..., postgresql://...) for a study shared across clusters.
    storage: str | None = None
    # Budget: stop taking trials once the trials have used this many GPU-hours (ranks x hours on a CPU cluster).
    max_gpu_hours: float | None = num(None, 0, lo_open=True)
    # Budget: stop taking trials this many seconds after the search was first started.
    timeout: float | None = num(None, 0, lo_open=True)
