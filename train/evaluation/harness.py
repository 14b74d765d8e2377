"""lm-evaluation-harness tasks scored on the model in hand (eval.harness.*; the rules: contract/rules/harness.py):
lm_eval's own simple_evaluate over our model behind its model interface (harness_lm.py), its TaskManager with
eval.harness.include_path. Run by the Validator wherever validation runs: in the loop, evaluation jobs and
launcher.evaluate. Offline: the datasets library and the Hub client are switched offline before lm_eval loads
anything, so a task reads the local files the launch checked, and never the network.

The pass leaves training as it was: RNG streams (torch's, Python's, numpy's, which simple_evaluate seeds) are
restored after it, and the model goes back to its mode. Rank 0 of the data-parallel group aggregates; every rank
returns the same values (broadcast), as the validation losses are on every rank.
"""

from __future__ import annotations

import logging
import os
import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from contract.errors import ConfigError
from contract.rules import harness as rules
from train.observe import quiet

# DISABLE_MULTIPROC: lm_eval's bootstrap_stderr (perplexity, f1, bleu, median, ... stderrs) otherwise forks a
# multiprocessing.Pool from the rank's process, whose other threads may hold a lock at the fork: the forked worker
# waits on it for ever, and the rank with it (tests/unit/test_harness_bootstrap.py).
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "DISABLE_MULTIPROC": "1"}


def go_offline() -> None:
    """The datasets library's and the Hub client's offline switches, before and after they are imported."""
    os.environ.update(OFFLINE)
    import datasets
    import datasets.config

    datasets.config.HF_HUB_OFFLINE = True
    datasets.config.HF_DATASETS_OFFLINE = True
    datasets.disable_progress_bars()


class Harness:
    def __init__(self, cfg: Any, strategy: Any, device: torch.device) -> None:
        from contract.data.run_tokenizer import run_tokenizer

        self.tasks = rules.tasks(cfg)
        section = rules.section(cfg)
        self.num_fewshot = None if section.get("num_fewshot") is None else int(section.num_fewshot)
        self.limit = rules.limit(cfg)
        self.batch_size = int(section.batch_size)
        self.include_path = str(section.include_path) if section.get("include_path") else None
        self.max_length = int(cfg.model.max_seq_len)
        self.strategy, self.device = strategy, device
        tokenizer, why = run_tokenizer(cfg.data)
        if tokenizer is None:
            raise ConfigError(f"eval.harness.tasks need the run's tokenizer and there is none: {why}")
        self.tokenizer = tokenizer
        self._manager: Any = None

    def manager(self) -> Any:
        """lm_eval's TaskManager, built once (it indexes every task YAML): the include path alone when it holds
        every task named, else lm_eval's own tasks too."""
        if self._manager is None:
            go_offline()
            quiet.harness_notices()
            logging.getLogger("lm_eval").setLevel(logging.WARNING)
            from lm_eval.tasks import TaskManager

            own = self.include_path is not None and all(name in rules.task_index(self.include_path)
                                                         for name in self.tasks)
            self._manager = TaskManager(include_path=self.include_path, include_defaults=not own)
        return self._manager

    def run(self, model: torch.nn.Module) -> dict[str, float]:
        """`harness/TASK/METRIC` and `harness/TASK/METRIC_stderr` of every task, on every rank."""
        from lm_eval import simple_evaluate

        from train.evaluation.harness_lm import RunLM

        manager = self.manager()
        lm = RunLM(model, self.strategy, self.device, self.tokenizer, self.max_length, self.batch_size)
        py_state, np_state = random.getstate(), np.random.get_state()
        devices = [self.device] if self.device.type == "cuda" else []
        was_training = model.training
        try:
            with torch.random.fork_rng(devices=devices), torch.no_grad():
                model.train(False)
                # log_samples: each document's choices, for its task's chance level (chance_levels)
                out = simple_evaluate(model=lm, tasks=list(self.tasks), num_fewshot=self.num_fewshot,
                                      limit=self.limit, task_manager=manager, log_samples=True)
        finally:
            model.train(was_training)
            random.setstate(py_state)
            np.random.set_state(np_state)
        values = {**rules.result_values(out["results"]), **chance_levels(out)} if out is not None else {}
        if dist.is_initialized() and dist.get_world_size() > 1:
            box = [values]
            dist.broadcast_object_list(box, src=0)
            values = box[0]
        return values


def chance_levels(out: dict[str, Any]) -> dict[str, float]:
    """`harness/TASK/chance` of each multiple-choice task: the accuracy of a uniform guess, the mean over its
    documents of 1 / their number of choices (one loglikelihood request each), which launcher.report draws."""
    levels = {}
    for task, config in (out.get("configs") or {}).items():
        samples = (out.get("samples") or {}).get(task) or []
        if config.get("output_type") != "multiple_choice" or not samples:
            continue
        shares = [1 / len(s["arguments"]) for s in samples if s.get("arguments")]
        if shares:
            levels[f"{rules.PREFIX}{task}/{rules.CHANCE}"] = sum(shares) / len(shares)
    return levels
