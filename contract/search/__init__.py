"""A hyperparameter search's files and its Optuna objects, shared by the launcher that creates the study, the workers
that run its trials (launcher/sweeps/search_worker.py) and the trials that report to it (train/search/).

    layout.py   the sweep directory of a search (search.json, the journal, the workers' state, the trials' run
                directories) and a trial's trial.json
    optuna_objects.py   the spec's pruner, sampler, storage and distributions as Optuna objects (optuna imported lazily)
    progress.py   a trial's steps trained and steady time per step, read from its run directory
"""
