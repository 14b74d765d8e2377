"""`python -m launcher -m ...`: Hydra multirun sweeps as SLURM job arrays (or one point after another here).

    sweep.py       the `slurmtrain` Hydra Launcher and Sweeper plugin (hydra_plugins/ registers it)
    sweep_run.py   a training sweep: every point planned first, then one job array per resource shape
    points.py      one point: composed by the launcher (PointLoader), validated and planned (PointRun)
    summary.py     the table that ends a local sweep: each point's result, ranked by what was measured
    sweepdir.py    the sweep directory's sweep.json: the points, their run directories, the arrays that ran them

`-m hydra/sweeper=search`: a hyperparameter search (an Optuna study; its files: contract/search/layout.py)
    search.py         checked whole, the study created, the workers started here or submitted
    search_settings.py  search.* checked, the study's spec built (metric, rungs, budget, worst case), a continued one
    search_space.py   the search space from Hydra's sweep syntax (interval, tag(log,...), choice, range)
    search_local.py   the workers as local processes: started, Ctrl-C forwarded, waited for; the end's exit code
    search_submit.py  the workers as one SLURM job array
    search_worker.py  a worker: take a trial (its own interrupted one first), train it as a local run, tell the study
    search_status.py  launcher.status of a search: the trials, the best (or why none), GPU-hours, --json's rows/total
    trial_state.py    what a trial the study holds as RUNNING is doing: running, pending (requeued), stopped
    search_report.py  launcher.report of a search: search.png and importances.png
"""
