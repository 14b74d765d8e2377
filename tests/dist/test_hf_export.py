"""model=hf_causal_lm from a local config trains with fsdp on 2 ranks; `python -m launcher.export` turns the
2-rank checkpoint into a Hugging Face directory and a safetensors file that reproduce the trained model. Tied
weights (ours by default, a Hugging Face config with tie_word_embeddings) are stored once, so each format loads
with its library's own loader as the manual (docs/weights.md) shows; what export writes follows the user's umask.
Our transformer with checkpoint.export_hf=true leaves a verified Hugging Face export of its final checkpoint, named in status."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from tests.conftest import ROOT, launcher_env
from tests.dist.store import hosted_port
from tests.dist.workers import train_and_dump_full_model
from tests.forked_cli import EXPORT_PRELOAD, run_module
from tests.prepared_data import write_prepared

pytestmark = pytest.mark.dist

HF_CONFIG = ROOT / "tests" / "fixtures" / "tiny_llama"
RUNS = {
    "hf": ["model=hf_causal_lm", f"model.config_path={HF_CONFIG}", "strategy=fsdp", "trainer.max_steps=12"],
    # Ours, with tied embeddings and activation checkpointing's wrapper names in the saved keys.
    "ours": ["model=tiny", "strategy=fsdp", "strategy.activation_checkpointing=true", "trainer.max_steps=3"],
    # A Hugging Face model whose output layer shares the input embedding (config path filled in by the fixture).
    "hf_tied": ["model=hf_causal_lm", "strategy=fsdp", "trainer.max_steps=3"],
    # Ours on a prepared `bytes` dataset (data filled in by the fixture), exported by rank 0 at the end.
    "ours_export": ["model=tiny", "strategy=fsdp", "trainer.max_steps=3", "checkpoint.export_hf=true"],
}
TIED = {"ours": ("embed.weight", "lm_head.weight"), "hf_tied": ("lm_head.weight", "model.embed_tokens.weight")}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hf_runs")
    tied_config = json.loads((HF_CONFIG / "config.json").read_text()) | {"tie_word_embeddings": True}
    (out / "tied_llama").mkdir()
    (out / "tied_llama" / "config.json").write_text(json.dumps(tied_config))
    write_prepared(out / "bytes data", [list(b"the quick brown fox jumps over the lazy dog. " * 40) + [256]] * 8)
    runs = {**RUNS, "hf_tied": [*RUNS["hf_tied"], f"model.config_path={out / 'tied_llama'}"],
            "ours_export": [*RUNS["ours_export"], "data=tokens", f"data.path={out / 'bytes data'}",
                            "model.vocab_size=257"]}
    mp.spawn(train_and_dump_full_model, args=(2, hosted_port(2), str(out), runs), nprocs=2)
    return out


def export(*args: str, umask: int = -1, real_process: bool = False) -> subprocess.CompletedProcess[str]:
    """`python -m launcher.export ARGS`: forked from a process that imported torch and transformers already
    (tests/forked_cli.py, seconds less each), or in a real interpreter."""
    if real_process:
        return subprocess.run([sys.executable, "-m", "launcher.export", *args], capture_output=True, text=True,
                              env=launcher_env(), timeout=300, umask=umask)
    return run_module("launcher.export", args, cwd=os.getcwd(), env=launcher_env(), timeout=300, umask=umask,
                      preload=EXPORT_PRELOAD)


def reference(trained: Path, name: str) -> dict[str, Any]:
    return torch.load(trained / name / "reference.pt")  # type: ignore[no-any-return]


def last_step(trained: Path, name: str) -> int:
    return max(reference(trained, name)["losses"])


def test_hf_model_trains_with_fsdp_and_its_export_gives_the_same_logits(trained: Path) -> None:
    from transformers import AutoModelForCausalLM

    ref = reference(trained, "hf")
    losses = ref["losses"]
    assert losses[12] < 0.8 * losses[1], losses  # it learns
    out = export(str(trained / "hf"), "--format", "hf", real_process=True)
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


@pytest.mark.parametrize("name", ["hf", "ours", "hf_tied"])
def test_safetensors_of_a_2_rank_fsdp_checkpoint_loads_with_load_model(trained: Path, name: str) -> None:
    """safetensors.torch.load_model, the library's loader for models with shared tensors, takes the file strictly;
    a tied tensor is stored once, under the name save_model keeps, and the file's metadata names the other."""
    from omegaconf import OmegaConf
    from safetensors import safe_open
    from safetensors.torch import load_model

    from train.model.build import build_model, logits_of

    ref = reference(trained, name)
    path = trained / f"{name}.safetensors"
    out = export(str(trained / name), "--format", "safetensors", "--out", str(path))
    assert out.returncode == 0, out.stderr[-3000:]
    cfg = OmegaConf.load(trained / name / "checkpoints" / f"step_{last_step(trained, name)}" / "config.yaml")
    model = build_model(cfg.model).eval()  # one process, no wrapper
    load_model(model, str(path), strict=True)
    mine = model.state_dict()
    assert sorted(mine) == sorted(ref["state"])
    for key, value in ref["state"].items():
        assert torch.equal(mine[key], value), key
    with torch.no_grad():
        torch.testing.assert_close(logits_of(model(ref["tokens"])), ref["logits"], rtol=1e-5, atol=1e-5)
    with safe_open(str(path), "pt") as f:
        keys, metadata = set(f.keys()), f.metadata()
    if name in TIED:
        kept, dropped = TIED[name]
        assert kept in keys and dropped not in keys and metadata[dropped] == kept
        assert mine[kept].data_ptr() == mine[dropped].data_ptr()  # loaded tied
    else:
        assert keys == set(mine)
    assert metadata["step"] == str(last_step(trained, name))
    if name == "ours":  # slurmtrain's transformer exports as a Hugging Face model too, verified (issue 29)
        hf = export(str(trained / name), "--format", "hf")
        assert hf.returncode == 0 and "export: verified: logits within" in hf.stderr, hf.stderr[-3000:]


README_BLOCKS = {"# --format safetensors": "safetensors", "# --format hf\n": "hf",
                 "# --format hf with the run's tokenizer": "hf with tokenizer"}


def readme_export_examples() -> dict[str, str]:
    """The manual's Python examples for loading an export (docs/weights.md's Export section), by the format their
    first line names."""
    text = (ROOT / "docs" / "weights.md").read_text()
    section = text[text.index("\n## Export\n"):]
    section = section[:section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    found = {name: block for block in blocks for start, name in README_BLOCKS.items() if block.startswith(start)}
    assert sorted(found) == sorted(README_BLOCKS.values()) and len(blocks) == len(found), blocks
    return found


def test_readme_examples_load_a_tied_exports_of_each_format(trained: Path) -> None:
    """The manual's own code, with its example run directory and step replaced by this run's."""
    ref = reference(trained, "hf_tied")
    step = last_step(trained, "hf_tied")
    for fmt in ("hf", "safetensors"):
        out = export(str(trained / "hf_tied"), "--format", fmt)
        assert out.returncode == 0, out.stderr[-3000:]
    for fmt, code in [(f, c) for f, c in readme_export_examples().items() if f in ("hf", "safetensors")]:
        code = code.replace("w/llama_ft", str(trained / "hf_tied")).replace("step_5", f"step_{step}")
        namespace: dict[str, Any] = {}
        exec(compile(code, f"docs/weights.md ({fmt})", "exec"), namespace)
        model = namespace["model"].eval()
        with torch.no_grad():
            output = model(ref["tokens"])
        logits = output if isinstance(output, torch.Tensor) else output.logits
        torch.testing.assert_close(logits, ref["logits"], rtol=1e-5, atol=1e-5, msg=fmt)
        weights = dict(model.named_parameters(remove_duplicate=False))
        assert weights["lm_head.weight"] is weights["model.embed_tokens.weight"], fmt  # loaded tied


@pytest.mark.parametrize("umask", [0o022, 0o077])
@pytest.mark.parametrize("name,fmt", [("ours", "safetensors"), ("hf", "hf"), ("hf", "safetensors")])
def test_what_export_writes_follows_the_umask(trained: Path, tmp_path: Path, name: str, fmt: str,
                                              umask: int) -> None:
    """Every file and directory export creates (the parents of --out included) has the mode a plain open() or
    mkdir() gives under the user's umask, as every other file of a run does."""
    target = tmp_path / "new" / "dir" / ("model.safetensors" if fmt == "safetensors" else "hf_model")
    out = export(str(trained / name), "--format", fmt, "--out", str(target), umask=umask)
    assert out.returncode == 0, out.stderr[-3000:]
    created = [tmp_path / "new", *sorted((tmp_path / "new").rglob("*"))]
    assert target in created and (fmt == "safetensors" or len([p for p in created if p.is_file()]) >= 2)
    for path in created:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        want = (0o777 if path.is_dir() else 0o666) & ~umask
        assert mode == want, f"{path.relative_to(tmp_path)}: {oct(mode)}, want {oct(want)} under umask {oct(umask)}"


def run_with_model(trained: Path, tmp_path: Path, model: dict[str, Any]) -> Path:
    """A copy of the `ours` run whose exported checkpoint names another model."""
    from omegaconf import OmegaConf

    run = tmp_path / "run"
    step = last_step(trained, "ours")
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(trained / "ours" / "checkpoints" / f"step_{step}", run / "checkpoints" / f"step_{step}")
    config = run / "checkpoints" / f"step_{step}" / "config.yaml"
    cfg = OmegaConf.load(config)
    cfg.model = OmegaConf.merge(cfg.model, model)
    OmegaConf.save(cfg, config)
    return run


def test_a_model_whose_code_cannot_be_imported_is_refused_before_anything_is_written(trained: Path,
                                                                                      tmp_path: Path) -> None:
    run = run_with_model(trained, tmp_path, {"_target_": "nosuchmod.Net", "args": {}})
    before = sorted(run.rglob("*"))
    out = export(str(run), "--format", "safetensors", real_process=True)  # the model is imported from the cwd
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr[-3000:]
    assert out.stderr.startswith("error: ") and "run from the directory that holds nosuchmod.py" in out.stderr
    assert sorted(run.rglob("*")) == before


def test_a_model_that_cannot_be_built_on_meta_is_exported_with_every_name_and_a_warning(trained: Path,
                                                                                        tmp_path: Path) -> None:
    from safetensors.torch import load_file

    run = run_with_model(trained, tmp_path, {"_target_": "json.loads", "args": {"s": "not json"}})
    out = export(str(run), "--format", "safetensors")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.startswith("warning: building the model on the meta device failed (JSONDecodeError")
    weights = load_file(out.stdout.strip().splitlines()[-1])
    assert sorted(weights) == sorted(reference(trained, "ours")["state"])


@pytest.mark.parametrize("fmt", ["safetensors", "hf"])
def test_an_out_path_that_cannot_be_written_is_one_line_and_leaves_nothing(trained: Path, fmt: str) -> None:
    """A real checkpoint to a path no one can write: the refusal comes before the weights are read, not as a
    traceback from the writer."""
    before = sorted((trained / "hf").rglob("*"))
    target = f"/proc/x.{fmt}"
    out = export(str(trained / "hf"), "--format", fmt, "--out", target)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr[-3000:]
    assert out.stderr.startswith(f"error: cannot write {target} (") and "--out PATH in a directory you can write" in (
        out.stderr)
    assert sorted((trained / "hf").rglob("*")) == before and not Path(target).exists()


def test_export_hf_at_the_end_of_training_leaves_a_verified_export_named_in_status(
        trained: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from contract.rundir.hf_export import read_record
    from launcher import status

    run, ref = trained / "ours_export", reference(trained, "ours_export")
    out = run / "export" / "hf_step_3"
    record = read_record(run)
    assert record is not None and record["ok"] and record["step"] == 3 and record["path"] == str(out), record
    assert record["detail"].startswith("verified: logits within ") and "greedy continuations of 32 tokens" in (
        record["detail"])
    assert not [p for p in (run / "export").iterdir() if ".partial-" in p.name]
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():  # the trained model's own logits, as the 2 fsdp ranks computed them
        torch.testing.assert_close(model(ref["tokens"]).logits, ref["logits"], rtol=1e-4, atol=1e-4)
    assert AutoTokenizer.from_pretrained(out).decode([104, 105, 256]) == "hi<|endoftext|>"
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 256
    capsys.readouterr()
    shutil.copy(run / "checkpoints" / "step_3" / "config.yaml", run / "config.yaml")  # as the launcher writes it
    assert status.main([str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["hf_export"]["path"] == str(out)
    assert status.main([str(run)]) == 0
    assert "ours_export: Hugging Face export: step 3 at" in " ".join(capsys.readouterr().out.split())


def test_readme_example_loads_our_models_export_with_its_tokenizer(trained: Path) -> None:
    """The manual's own code for `--format hf` of our transformer, on the export checkpoint.export_hf wrote."""
    code = readme_export_examples()["hf with tokenizer"]
    code = code.replace("corpus/runs/code/export/hf_step_200", str(trained / "ours_export" / "export" /
                                                                       "hf_step_3"))
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/weights.md (hf with tokenizer)", "exec"), namespace)
    assert namespace["text"].startswith("def main(") and len(namespace["text"]) > len("def main(")
