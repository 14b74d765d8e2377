"""A trial of a hyperparameter search, seen from its ranks (launcher/sweeps/search.py starts the search).

    trial_report.py   at each evaluation rank 0 reports the search's metric to the study (each step once, across
                      requeues) and asks the pruner; the ranks agree, and a pruned trial ends with a `pruned` event
"""
