"""Reading what runs leave behind, for launcher.status and launcher.report. Torch-free. (The files' formats
are the contract's: contract/rundir/.)

    runs.py            the runs a directory stands for (a run, a sweep, a run root), their configs and job ids
    run_rows.py        one row per run: state, step, checkpoint, losses, attempt ends, goodput, hours
    ranking.py         choosing by what was measured: a run's best checkpoint (--best), a sweep's points ranked
    validation_log.py  a run's validation losses, in-loop or from evaluation jobs
"""
