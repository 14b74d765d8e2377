"""The plan's lines on how a step runs: what is compiled and when the collector runs, float8, the loss's path, and the
early checkpoint check's cost (each rule's own line, from contract/rules/)."""

from __future__ import annotations

from typing import Any

from contract.rules.float8 import plan_line as float8_line
from contract.rules.loss_chunks import plan_line as loss_line
from contract.rules.step_options import step_line
from contract.rules.verify_early import plan_line as verify_early_line
from launcher.plan.estimate import ModelShape


def step_lines(cfg: Any, shape: ModelShape | None, seq_len: int, state_bytes: float | None) -> tuple[str, ...]:
    """`state_bytes`: the states per rank (the memory estimate's), what the early checkpoint check writes."""
    lines = [step_line(cfg), float8_line(cfg)]
    if shape is not None and shape.vocab_size:
        cp = int(cfg.parallel.get("cp", 1))
        lines.append(loss_line(int(cfg.trainer.micro_batch_size) * seq_len // cp, int(shape.vocab_size), cfg))
    lines.append(verify_early_line(cfg, state_bytes))
    return tuple(line for line in lines if line)
