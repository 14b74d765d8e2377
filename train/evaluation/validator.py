"""The in-loop evaluation pass (torchtitan's Validator, Megatron's eval_interval/eval_iters, in our terms).

Each set's samples are fixed: global sample indices [0, eval.batches x global batch), split over the
data-parallel ranks the way training splits a step (train/data/batches.py), so the set is the same on any world
size. The loss is the global token-weighted mean: each rank sums its token losses and counts its tokens, and both
are summed over every rank (tensor-parallel peers hold the same sums, which scales both alike). The pass runs in
eval mode under no_grad with the RNG streams forked, so training draws exactly what it would have without it.
The first pass reads each set and keeps its batches (set_batches.py): later passes cost only the forward. A set with
fewer samples than a pass reads is read round-robin; the first pass says so (sets.repeat_warning).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from contract.rules.eval_sets import (
    HELD_OUT_START,
    enabled,
    eval_section,
    repeat_warning,
    resolved_sets,
    validates,
)
from contract.rules.harness import tasks as harness_tasks
from contract.rundir import validation_log
from train.data.batches import IGNORE_INDEX, forward_kwargs, planned_micro_batches
from train.distributed import all_reduce_max
from train.evaluation.harness import Harness
from train.evaluation.set_batches import SetBatches, samples_in
from train.model.build import logits_of
from train.observe.metrics import log


class HeldOut:
    """The synthetic stream's samples from HELD_OUT_START on, as sample 0, 1, ..."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def sample(self, index: int) -> Any:
        return self.source.sample(HELD_OUT_START + index)

    def sample_batch(self, indices: Any) -> Any:
        return self.source.sample_batch([HELD_OUT_START + int(i) for i in indices])


def build_set_source(cfg: Any, entry: dict[str, Any], name: str = "") -> Any:
    """A TokenSource over one resolved set (contract/rules/eval_sets.py), read in order."""
    from omegaconf import OmegaConf

    kind, data = entry["kind"], cfg.data
    if kind == "synthetic":
        from train.data.synthetic import SyntheticTokens

        return HeldOut(SyntheticTokens(int(cfg.model.vocab_size), int(data.seq_len), int(entry["seed"]),
                                       float(data.get("signal", 0.9))))
    if kind == "dataset":
        from train.data.dataset import build_dataset_source

        return build_dataset_source(OmegaConf.create({"_target_": entry["_target_"], "args": entry.get("args") or {},
                                                     "seed": int(data.seed), "shuffle": False,
                                                     "seq_len": int(data.seq_len)}),
                                    key=f"eval.sets.{name}._target_")
    one = OmegaConf.create({"name": "tokens", "path": str(entry["path"]), "dtype": str(data.dtype),
                            "seq_len": int(data.seq_len), "seed": int(data.seed), "shuffle": False, "sources": {},
                            "sft_layout": str(data.get("sft_layout") or "packed")})
    if kind == "val":
        from train.data.prepared import validation_sources

        return validation_sources(one)[""]
    from train.data.sources import token_source

    return token_source(one)


class Validator:
    """Due every eval.every steps and at the end. With eval.async_jobs the loop's only pass is step 0's
    (eval.at_start); an evaluation job (train/evaluation/job.py) runs the same pass on a checkpoint (`always`:
    launcher.evaluate's, whether or not the run validates). eval.harness.tasks are scored in the same pass."""

    def __init__(self, cfg: Any, strategy: Any, device: torch.device, always: bool = False) -> None:
        active = always or validates(cfg)  # eval.at_start alone: step 0 only
        self.every = int(eval_section(cfg).every) if enabled(cfg) else 0
        self.at_start = bool(eval_section(cfg).at_start) if active else False
        self.max_steps = int(cfg.trainer.max_steps)
        self.strategy, self.device = strategy, device
        self.sets = {name: build_set_source(cfg, entry, name) for name, entry in resolved_sets(cfg, on_ranks=True).items()
                     } if active else {}
        t = cfg.trainer
        self.batches = int(eval_section(cfg).batches) if active else 0
        self.global_batch = int(t.global_batch_size)
        self.accum = int(t.grad_accum_steps)
        self.micro_batches = list(planned_micro_batches(0, self.batches, int(t.grad_accum_steps), strategy.dp_rank,
                                                        strategy.dp_size, int(t.micro_batch_size)))
        # What one batch of a pass is: a micro batch, or a pipeline step's micro batches, which its schedule splits.
        self.pipeline: Any = getattr(strategy, "pipeline", None)
        per_batch = self.accum if self.pipeline is not None else 1
        groups = [[i for micro in self.micro_batches[first:first + per_batch] for i in micro]
                  for first in range(0, len(self.micro_batches), per_batch)]
        self.set_batches = SetBatches(self.sets, groups, pin=device is not None and device.type == "cuda",
                                      documents=bool(cfg.data.get("document_mask", False)))
        self.first_pass = True
        self.harness: Harness | None = Harness(cfg, strategy, device) if active and harness_tasks(cfg) else None

    def due(self, step: int) -> bool:
        if step == 0:
            return self.at_start
        return bool(self.every) and (step % self.every == 0 or step == self.max_steps)

    def due_at_start(self, step: int, run_dir: Path) -> bool:
        """Due at the step a run starts or resumes from, unless its validation is recorded in the run directory
        already: a checkpoint is saved after its step's pass (a periodic save at a multiple of eval.every, a stop at
        one, the end before max_steps is raised), and a restart with no checkpoint keeps the step-0 row. Rank 0 reads
        the record; every rank follows its answer (the pass is a collective)."""
        if not self.due(step):
            return False
        recorded = self.strategy.env.is_main and validation_log.validated(run_dir, step)
        return not all_reduce_max(int(recorded), self.device)

    def run(self, model: torch.nn.Module) -> dict[str, float]:
        """Every set's global loss and perplexity, as metrics fields val/NAME/loss and val/NAME/ppl."""
        devices = [self.device] if self.device.type == "cuda" else []
        sums = torch.zeros(2 * len(self.sets), dtype=torch.float64, device=self.device)
        was_training = model.training
        if self.first_pass:
            self._warn_repeats()
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            model.train(False)
            try:
                for k, name in enumerate(self.sets):
                    sums[2 * k:2 * k + 2] = self._sums(model, name)
            finally:
                model.train(was_training)
        if self.first_pass:
            self.first_pass = False
            note = self.set_batches.note()
            if note and self.strategy.env.is_main:
                log.info(note)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(sums)
        out: dict[str, float] = {}
        for k, name in enumerate(self.sets):
            loss = float(sums[2 * k] / sums[2 * k + 1].clamp(min=1))
            out[f"val/{name}/loss"] = loss
            out[f"val/{name}/ppl"] = math.exp(min(loss, 700.0))
        if self.harness is not None:
            out.update(self.harness.run(model))
        return out

    def _warn_repeats(self) -> None:
        """At the first pass, on rank 0: each set smaller than a pass, which round-robin reads twice."""
        if not self.strategy.env.is_main:
            return
        for name, source in self.sets.items():
            samples = samples_in(source)
            words = None if samples is None else repeat_warning(name, samples, self.batches, self.global_batch)
            if words:
                log.warning(words)

    def _sums(self, model: torch.nn.Module, name: str) -> torch.Tensor:
        if self.pipeline is not None:
            return self._pipeline_sums(name)
        total = torch.zeros(2, dtype=torch.float64, device=self.device)
        for batch in self.set_batches.of(name):
            inputs, targets, *extra = (x.to(self.device, non_blocking=True) for x in batch)
            inputs, targets = self.strategy.split_sequence(inputs, targets)  # parallel.cp: this rank's chunks
            with self.strategy.autocast():
                logits = logits_of(model(inputs, **forward_kwargs(extra)))
            flat = targets.reshape(-1)
            total[0] += F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), flat, ignore_index=IGNORE_INDEX,
                                        reduction="sum").double()
            total[1] += (flat != IGNORE_INDEX).sum()
        return total

    def _pipeline_sums(self, name: str) -> torch.Tensor:
        """A pipeline stage's share: each step's micro batches go through the schedule forward only (its eval), as
        training sends them; the last stage holds the losses, one mean per micro batch, and counts the tokens."""
        pipeline, accum = self.pipeline, int(self.accum)
        total = torch.zeros(2, dtype=torch.float64, device=self.device)
        for batch in self.set_batches.of(name):
            inputs, targets, *extra = (x.to(self.device, non_blocking=True) for x in batch)
            inputs, targets = self.strategy.split_sequence(inputs, targets)  # parallel.cp: this rank's chunks
            losses = pipeline.forward_only(inputs, targets, *extra)
            if pipeline.last:
                for loss, micro_targets in zip(losses, targets.chunk(accum), strict=True):
                    count = (micro_targets != IGNORE_INDEX).sum()
                    total[0] += loss.detach().double() * count
                    total[1] += count
        return total
