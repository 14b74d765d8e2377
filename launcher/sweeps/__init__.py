"""`python -m launcher -m ...`: Hydra multirun sweeps as SLURM job arrays (or one point after another here).

    sweep.py       the `slurmtrain` Hydra Launcher and Sweeper plugin (hydra_plugins/ registers it)
    sweep_run.py   a training sweep: every point planned first, then one job array per resource shape
    summary.py     the table that ends a local sweep: each point's result, ranked by what was measured
    sweepdir.py    the sweep directory's sweep.json: the points, their run directories, the arrays that ran them
"""
