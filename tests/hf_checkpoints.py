"""Runs with one checkpoint of slurmtrain's transformer, written in this process (no training): the composed config
as the launcher resolves it and the model's weights as DCP stores them, for export and init_from tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from contract.rundir import ckpt_layout as layout
from launcher.compose import compose_config

# Three families as acceptance 1 names them: Llama-style with grouped-query attention and an untied head, tiny,
# GPT-2-style (small enough to export and verify in about a second each).
FAMILIES = {
    "llama_gqa_untied": ["model.d_model=64", "model.n_heads=4", "model.n_kv_heads=2", "model.ffn_hidden=96",
                         "model.tie_embeddings=false", "model.rope_theta=500000", "model.norm_eps=1e-6"],
    "tiny": [],
    "gpt2": ["model.position=learned", "model.mlp=gelu", "model.norm=layernorm", "model.d_model=48",
             "model.n_heads=4", "model.ffn_hidden=96"],
    # A mixture of experts (4 experts, top 2, grouped-query attention): MixtralForCausalLM.
    "mixtral": ["model=moe_tiny", "model.n_kv_heads=2"],
}


def sharpen(model: torch.nn.Module, seed: int) -> None:
    """Weights far from a fresh init (larger, norms not 1): attention that depends on the positions, as a trained
    model's does, so that a wrong mapping shows plainly."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if p.dim() == 1:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=generator))


def bytes_data(root: Path) -> list[str]:
    """Overrides for a prepared dataset of the `bytes` tokenizer (end of document 256) under `root`."""
    from tests.prepared_data import write_prepared

    if not (root / "bytes data").is_dir():
        write_prepared(root / "bytes data", [list(b"abcdefgh" * 40) + [256]])
    return ["data=tokens", f"data.path={root / 'bytes data'}", "model.vocab_size=257"]


def write_run(root: Path, name: str, overrides: list[str], step: int = 5, seed: int = 0,
              state: dict[str, torch.Tensor] | None = None, sharp: bool = True,
              boost: tuple[int, float] | None = None) -> tuple[Path, DictConfig]:
    """RUN_ROOT/NAME with a complete checkpoint at `step` holding `state` (default: the model built from the
    config, sharpened unless `sharp` is False, the output row of id boost[0] scaled by boost[1]): its config.yaml
    and DCP's model entries, as the checkpoint manager writes them."""
    import torch.distributed.checkpoint as dcp

    from train.model.build import build_model

    cfg = compose_config([*overrides, f"run.root={root}", f"run.name={name}", "logger.backend=none"])
    if state is None:
        torch.manual_seed(seed)
        model = build_model(cfg.model)
        if sharp:
            sharpen(model, seed)
        if boost is not None:
            head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else model.lm_head
            with torch.no_grad():
                head.weight[boost[0]] *= boost[1]
        state = {k: v.clone() for k, v in model.state_dict().items()}
    run_dir = root / name
    step_dir = layout.step_dir(run_dir, step)
    step_dir.mkdir(parents=True)
    dcp.save({"app": {"model": state}}, checkpoint_id=str(step_dir / "model_optim"), no_dist=True)
    OmegaConf.save(cfg, step_dir / "config.yaml", resolve=True)
    (step_dir / layout.MARKER).write_text("{}\n")
    return run_dir, cfg


def state_of(run_dir: Path, step: int = 5) -> dict[str, Any]:
    from train.weights.export import load_model_state

    return load_model_state(layout.step_dir(run_dir, step))
