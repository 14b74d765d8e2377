"""What a rank reports.

    metrics.py     rank-tagged logging, metrics.jsonl rows (format: contract/rundir/metrics_file.py), wandb, the
                   rank-0 progress bar
    scalars.py     a row's scalars for the dashboards (wandb, TensorBoard: tensorboard_log.py)
    tensorboard_log.py  logger.backend=tensorboard: the rows as TensorBoard scalars
    telemetry.py   step time, data wait, TFLOP/s and MFU, peak memory, stragglers, the profiler trace
    moe_stats.py   a MoE model's expert load per layer, dropped tokens and auxiliary losses, read at log steps
    memory.py      what a rank really holds, measured, against the launch plan's estimate
    quiet.py       third-party notices known harmless in our uses (each filter says why), everything else let through
    sync_count.py  host reads of device values per training step (the guard that a steady step reads none)
"""
