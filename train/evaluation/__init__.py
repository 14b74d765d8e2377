"""Validation during training and evaluation jobs (eval.*). The sets are resolved and checked by the
contract (contract/rules/eval_sets.py), so the launcher refuses a bad set at launch.

    set_batches.py  a set's batches, read once and kept
    validator.py    the evaluation pass: forward only, the global token-weighted loss over all ranks, perplexity
    harness.py      eval.harness.tasks scored with lm-evaluation-harness (offline), in the same pass
    harness_lm.py   our model and tokenizer behind lm_eval's model interface, requests over the data-parallel ranks
    job.py          an evaluation job's rank: load a checkpoint's weights, run the pass, write eval/step_N.json
    submit.py       the sbatch call training's rank 0 makes for an evaluated checkpoint
"""
