"""Login-node side of slurmtrain: compose, validate, plan, dispatch. Never imports torch at import time."""
