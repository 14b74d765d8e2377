"""model=hf_causal_lm from a local config trains with fsdp on 2 ranks; `python -m launcher.export` turns the
2-rank checkpoint into a Hugging Face directory and a safetensors file that reproduce the trained model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from launcher.local import free_port
from tests.conftest import ROOT, launcher_env
from tests.dist.workers import train_and_dump_full_model

pytestmark = pytest.mark.dist

HF_CONFIG = ROOT / "tests" / "fixtures" / "tiny_llama"
RUNS = {
    "hf": ["model=hf_causal_lm", f"model.config_path={HF_CONFIG}", "strategy=fsdp", "trainer.max_steps=12"],
    # Ours, with tied embeddings and activation checkpointing's wrapper names in the saved keys.
    "ours": ["model=tiny", "strategy=fsdp", "strategy.activation_checkpointing=true", "trainer.max_steps=3"],
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hf_runs")
    mp.spawn(train_and_dump_full_model, args=(2, free_port(), str(out), RUNS), nprocs=2)
    return out


def export(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher.export", *args], capture_output=True, text=True,
                          env=launcher_env(), timeout=300)


def test_hf_model_trains_with_fsdp_and_its_export_gives_the_same_logits(trained: Path) -> None:
    from transformers import AutoModelForCausalLM

    ref = torch.load(trained / "hf" / "reference.pt")
    losses = ref["losses"]
    assert losses[12] < 0.8 * losses[1], losses  # it learns
    out = export(str(trained / "hf"), "--format", "hf")
    assert out.returncode == 0, out.stderr[-3000:]
    hf_dir = Path(out.stdout.strip().splitlines()[-1])
    assert hf_dir == trained / "hf" / "export" / "hf_step_12" and (hf_dir / "config.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    with torch.no_grad():
        logits = model(ref["tokens"]).logits
    # fp32 on CPU: the same weights give the same logits up to summation order.
    torch.testing.assert_close(logits, ref["logits"], rtol=1e-5, atol=1e-5)
    # Exporting again refuses to overwrite.
    again = export(str(trained / "hf"), "--format", "hf")
    assert again.returncode == 2 and "exists" in again.stderr and again.stderr.count("\n") == 1


@pytest.mark.parametrize("name", ["hf", "ours"])
def test_safetensors_of_a_2_rank_fsdp_checkpoint_loads_into_one_process(trained: Path, name: str) -> None:
    from omegaconf import OmegaConf
    from safetensors.torch import load_file

    from train.build import build_model

    ref = torch.load(trained / name / "reference.pt")
    out = export(str(trained / name), "--format", "safetensors", "--out", str(trained / f"{name}.safetensors"))
    assert out.returncode == 0, out.stderr[-3000:]
    weights = load_file(str(trained / f"{name}.safetensors"))
    step = max(ref["losses"])
    cfg = OmegaConf.load(trained / name / "checkpoints" / f"step_{step}" / "config.yaml")
    model = build_model(cfg.model)  # one process, no wrapper
    model.load_state_dict(weights, strict=True)
    mine = model.state_dict()
    assert sorted(mine) == sorted(ref["state"])
    for key, value in ref["state"].items():
        assert torch.equal(mine[key], value), key
    if name == "ours":  # the run also refuses --format hf, naming the right one
        wrong = export(str(trained / name), "--format", "hf")
        assert wrong.returncode == 2 and "use --format safetensors" in wrong.stderr
