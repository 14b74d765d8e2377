"""A harness task whose metric lm_eval bootstraps (perplexity, f1, bleu, median, ...) is scored without forking.

Found by trying it: a task YAML of the user's with `metric: perplexity` (a loglikelihood task) hung
`launcher.evaluate` forever. lm_eval's bootstrap_stderr opens a `multiprocessing.Pool(cpu_count())` by fork from the
rank's process, whose other threads (torch's, the data prefetcher's, the checkpoint writer's) may hold a lock at the
fork; the forked worker waits on it for ever and the rank with it. The pass must compute the bootstrap in its own
process (lm_eval's DISABLE_MULTIPROC switch), so a pool opened there fails this test.
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from contract.config.training import ModelConfig
from tests.harness_task import write_pattern_data


def write_perplexity_task(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / "ppl.jsonl"
    data.write_text("".join(json.dumps({"context": "abcd:", "answer": letter}) + "\n" for letter in "efghij"))
    (directory / "ppl_task.yaml").write_text(
        f"task: ppl_task\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {json.dumps(str(data))}\n"
        "test_split: test\noutput_type: loglikelihood\ndoc_to_text: \"{{context}}\"\n"
        "doc_to_target: \"{{answer}}\"\ntarget_delimiter: \"\"\n"
        "metric_list:\n  - metric: perplexity\n  - metric: acc\n")
    return directory


def test_a_bootstrapped_metric_is_scored_without_a_process_pool(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from train.evaluation.harness import Harness
    from train.model.build import build_model

    def no_pool(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the harness pass forked a multiprocessing pool from the rank's process")

    monkeypatch.setattr(multiprocessing, "Pool", no_pool)
    monkeypatch.delenv("DISABLE_MULTIPROC", raising=False)
    data = write_pattern_data(tmp_path / "data", docs=8)
    tasks = write_perplexity_task(tmp_path / "tasks")
    model_cfg = OmegaConf.merge(OmegaConf.structured(ModelConfig), {
        "name": "tiny", "vocab_size": 257, "d_model": 32, "n_layers": 1, "n_heads": 2, "ffn_hidden": 64,
        "max_seq_len": 32})
    cfg = OmegaConf.create({
        "model": model_cfg,
        "data": {"name": "tokens", "path": str(data)},
        "eval": {"harness": {"tasks": ["ppl_task"], "num_fewshot": None, "limit": None, "batch_size": 4,
                             "include_path": str(tasks)}}})
    torch.manual_seed(0)
    model = build_model(cfg.model)
    strategy = SimpleNamespace(dp_rank=0, dp_size=1, autocast=contextlib.nullcontext)
    values = Harness(cfg, strategy, torch.device("cpu")).run(model)
    assert math.isfinite(values["harness/ppl_task/perplexity"])
    assert values["harness/ppl_task/perplexity_stderr"] > 0
