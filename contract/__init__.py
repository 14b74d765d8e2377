"""The contract between the two sides: what launcher/ (login node) and train/ (compute nodes) both read and write.

Both sides import it; it imports neither of them, nor torch, deepspeed, wandb or transformers (import-linter:
`make lint`). Four parts:

    errors.py   ConfigError (one line that names the fix) and the exit codes every process agrees on
    atomic.py   JSON files written whole or not at all
    remote_snapshot.py   a project snapshot on a cluster (+remote): its id, manifest, default excludes
    config/     the config contract: the schema dataclasses that declare every key (remote.py: +remote=NAME),
                close-key suggestions
    rundir/     the run directory's files, read and written by both sides: events, metrics, accounting,
                checkpoint layout and markers, evaluation results, skipped samples, environment failures
    data/       the prepared-dataset format (manifest, fingerprints), the data-source spec and its checks,
                the mixture's apportionment
    container/  container=...: each runtime's command line around the ranks, the automatic mounts, a SLURM job's
                container lines, a requeue asked for inside a container
    search/     a hyperparameter search's files (the sweep directory, a trial's trial.json) and its Optuna objects
    rules/      pure functions both sides compute: schedules, FLOPs per token, sbatch parameters, evaluation sets
                and jobs, stability settings, model.init_from's source, the Hugging Face config, strategy names

The resolved config (RUN_DIR/config.yaml, typed by config/schema.py) is what the launcher hands the ranks.
"""
