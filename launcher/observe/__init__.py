"""Reading what runs leave behind, for launcher.status, launcher.report and the training side alike. Torch-free.

    runs.py            the runs a directory stands for (a run, a sweep, a run root), their configs and job ids
    run_rows.py        one row per run: state, step, checkpoint, losses, attempt ends, goodput, hours
    accounting.py      what SLURM says about a job: its queue state (squeue) and its attempts (sacct)
    events.py          RUN_DIR/events.jsonl: each attempt's end, and the figures derived from it (goodput)
    metrics_file.py    RUN_DIR/metrics.jsonl: strict JSON rows, written by the ranks, read by everyone
    validation_log.py  a run's validation losses, in-loop or from evaluation jobs
    eval_results.py    RUN_DIR/eval/: evaluation jobs' results and pending markers
    run_tokenizer.py   the tokenizer a run trained with, from its config (launcher.sample encodes and decodes)
"""
