"""Validation during training (eval.*): named sets, each evaluated on the same samples every time.

    sets.py       what eval.sets names, resolved and checked (torch-free: the launcher refuses a bad set at launch)
    validator.py  the evaluation pass: forward only, the global token-weighted loss over all ranks, perplexity
"""
