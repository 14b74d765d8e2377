"""Reading what runs leave behind, for launcher.status and launcher.report. Torch-free. (The files' formats
are the contract's: contract/rundir/, where a run's validation losses and its tokenizer are read too.)

    runs.py            the runs a directory stands for (a run, a sweep, a run root), their configs and job ids
    run_rows.py        one row per run: state, step, checkpoint, losses, attempt ends, goodput, hours
    run_cost.py        a run directory read into failure_cost's lanes: what its GPU-time went to, each failure
    ranking.py         choosing by what was measured: a run's best checkpoint (--best), a sweep's points ranked
    figures.py         what launcher.report draws: the training figure, line figures, a sweep's metric per key
    harness_figure.py  launcher.report's downstream scores: score against step, one panel per task
    figure_marks.py    what the figures mark: an attempt's stop and the next one's resume, each MoE layer's load
    cost_figure.py     launcher.report's goodput.png after a failure: what each run's GPU-time went to, each failure
"""
