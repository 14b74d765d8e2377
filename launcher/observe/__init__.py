"""Reading what runs leave behind, for launcher.status and launcher.report. Torch-free. (The files' formats
are the contract's: contract/rundir/, where a run's validation losses and its tokenizer are read too.)

    runs.py            the runs a directory stands for (a run, a sweep, a run root), their configs and job ids
    run_rows.py        one row per run: state, step, checkpoint, losses, attempt ends, goodput, hours
    ranking.py         choosing by what was measured: a run's best checkpoint (--best), a sweep's points ranked
    figures.py         what launcher.report draws: the training figure, line figures, a sweep's metric per key
    harness_figure.py  launcher.report's downstream scores: score against step, one panel per task
"""
