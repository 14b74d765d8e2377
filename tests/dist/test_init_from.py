"""model.init_from on 2 CPU ranks: fine-tuning from saved Hugging Face models (GPT-NeoX and Mixtral saved under other
names than their modules') and from another run's fsdp checkpoint under ddp and fsdp; a saved Hugging Face Llama and
GPT-2 converted into slurmtrain's own transformer under tensor parallelism, fsdp and ddp (issue 29); the first
step's loss is the loss the loaded weights give in one process on the same batch. A resume loads the run's own
checkpoint and never reads model.init_from (its source is gone by then)."""

from __future__ import annotations

import copy as copy_module
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from omegaconf import OmegaConf

from launcher.compose import compose_and_plan
from tests.conftest import read_metrics
from tests.dist.store import hosted_port
from train.data import build_source, load_micro_batch
from train.model.build import build_model, logits_of
from train.weights.export import load_model_state

pytestmark = pytest.mark.dist

WORLD, BATCH = 2, 8
COMMON = ["logger.backend=none", f"local.nproc={WORLD}", "data.seq_len=16", "trainer.micro_batch_size=4",
          f"trainer.global_batch_size={BATCH}", "trainer.log_every=1", "trainer.ckpt_every=0"]
OURS = ["model.d_model=32", "model.n_layers=2", "model.ffn_hidden=64"]
LAYOUTS = ("ddp", "fsdp")
# Saved Hugging Face models: Llama saves its modules' names; GPT-NeoX saves its head (lm_head) as embed_out and
# Mixtral each expert's projections apart (stacked in the model), which from_pretrained converts back.
HF_ARCHS = {"Llama": {"num_key_value_heads": 2}, "GPTNeoX": {},
            "Mixtral": {"num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2}}
HF_RUNS = [*(("Llama", s) for s in LAYOUTS), ("GPTNeoX", "fsdp"), ("Mixtral", "ddp")]
# Into slurmtrain's own transformer (its keys as the saved config.json has them; LlamaConfig's rms_norm_eps is 1e-6).
NATIVE = {"Llama": ["model.vocab_size=128", "model.d_model=32", "model.n_layers=2", "model.n_heads=4",
                    "model.n_kv_heads=2", "model.ffn_hidden=64", "model.norm_eps=1e-6", "model.tie_embeddings=false"],
          "GPT2": ["model.vocab_size=128", "model.d_model=32", "model.n_layers=2", "model.n_heads=4",
                   "model.ffn_hidden=64", "model.max_seq_len=64", "model.position=learned", "model.mlp=gelu",
                   "model.norm=layernorm", "model.tie_embeddings=false"],
          # MixtralConfig's defaults: rms_norm_eps 1e-5, rope_theta 1e6.
          "Mixtral": ["model.vocab_size=128", "model.d_model=32", "model.n_layers=2", "model.n_heads=4",
                      "model.n_kv_heads=2", "model.ffn_hidden=64", "model.rope_theta=1000000",
                      "model.tie_embeddings=false", "model.moe.num_experts=4", "model.moe.top_k=2"]}
NATIVE_RUNS = {"Llama-tp": ("Llama", ["strategy=fsdp", "parallel.tp=2"]), "Llama-fsdp": ("Llama", ["strategy=fsdp"]),
               "GPT2-ddp": ("GPT2", ["strategy=ddp"]),  # learned positions: no tensor parallelism yet
               # A saved Mixtral (each expert's projections apart) into the native MoE, its experts over 2 ranks.
               "Mixtral-ep2": ("Mixtral", ["strategy=ddp", "parallel.ep=2"])}


def _join(rank: int, port: int) -> None:
    from train import distributed

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), SLURMTRAIN_LAUNCHER="local",
                      TORCHELASTIC_USE_AGENT_STORE="True")  # the test process hosts the store (tests/dist/store.py)
    torch.set_num_threads(1)
    distributed.init_process_group(distributed.detect(), "gloo")


def run_planned(rank: int, port: int, runs: list[tuple[Any, str]], moves: dict[int, tuple[str, str]]) -> None:
    """Train each (config planned in the parent, run directory) in order on one process group; after run i, rank 0
    renames moves[i][0] to moves[i][1] (a source moved away while a resume runs: it must not need it)."""
    from train import distributed
    from train.loop import train

    _join(rank, port)
    try:
        env = distributed.detect()
        for i, (cfg, run_dir) in enumerate(runs):
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            if rank == 0:  # as the launcher writes it: the plan of a resume reads the run's own shape there
                OmegaConf.save(cfg, Path(run_dir) / "config.yaml", resolve=True)
            train(cfg, env, torch.device("cpu"), Path(run_dir))
            if i in moves:
                if rank == 0:
                    os.rename(*moves[i])
                dist.barrier()
    finally:
        distributed.destroy_process_group()


def _plan(root: Path, name: str, *overrides: str) -> tuple[Any, str, str]:
    """(config, run directory, the plan's weights line), planned as `python -m launcher` plans it."""
    cfg, plan = compose_and_plan([*COMMON, f"run.root={root}", f"run.name={name}", *overrides])
    return cfg, str(plan.run_dir), plan.weights_lines[0]


def _spawn(runs: list[tuple[Any, str]], moves: dict[int, tuple[str, str]] | None = None) -> None:
    mp.spawn(run_planned, args=(hosted_port(WORLD), runs, moves or {}), nprocs=WORLD)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import transformers

    root = tmp_path_factory.mktemp("init_from")
    hf_dirs = {}
    for arch, extra in HF_ARCHS.items():
        torch.manual_seed(7)
        config = getattr(transformers, f"{arch}Config")(vocab_size=128, hidden_size=32, intermediate_size=64,
                                                        num_hidden_layers=2, num_attention_heads=4,
                                                        max_position_embeddings=64, tie_word_embeddings=False, **extra)
        hf_dirs[arch] = root / f"saved {arch}"
        getattr(transformers, f"{arch}ForCausalLM")(config).save_pretrained(hf_dirs[arch])
    torch.manual_seed(7)  # GPT-2 initialises its biases to zero: slurmtrain's transformer (no biases) takes it
    gpt2 = transformers.GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_inner=64, n_positions=64,
                                   tie_word_embeddings=False)
    hf_dirs["GPT2"] = root / "saved GPT2"
    transformers.GPT2LMHeadModel(gpt2).save_pretrained(hf_dirs["GPT2"])
    # The source run: our transformer trained 3 steps under fsdp, its checkpoint at the end.
    source = _plan(root, "source", *OURS, "strategy=fsdp", "trainer.max_steps=3")
    _spawn([source[:2]])
    planned = {f"hf-{a}-{s}": _plan(root, f"hf-{a}-{s}", "model=hf_causal_lm", f"model.config_path={hf_dirs[a]}",
                                    f"model.init_from={hf_dirs[a]}", "trainer.max_steps=1", f"strategy={s}")
               for a, s in HF_RUNS}
    planned |= {f"native-{name}": _plan(root, f"native-{name}", *NATIVE[arch], f"model.init_from={hf_dirs[arch]}",
                                        "trainer.max_steps=1", *layout)
                for name, (arch, layout) in NATIVE_RUNS.items()}
    ckpt = [*OURS, f"model.init_from={source[1]}", "trainer.max_steps=1"]
    planned |= {f"ckpt-{s}": _plan(root, f"ckpt-{s}", *ckpt, f"strategy={s}") for s in LAYOUTS}
    # A run started from the same checkpoint, then resumed (trainer.max_steps raised) while the source is moved away.
    # Saves are synchronous here: stability's state check on the checkpoint group can meet an asynchronous save's
    # collectives in flight (a hang seen on this machine, not model.init_from's).
    resume = [*ckpt[:-1], "strategy=fsdp", "trainer.ckpt_every=1", "checkpoint.async_save=false"]
    first = _plan(root, "resumed", *resume, "trainer.max_steps=1")
    whole = _plan(root, "whole", *resume, "trainer.max_steps=2")
    then = (copy_module.deepcopy(whole[0]), first[1])  # the same run extended: resumes its step-1 checkpoint
    then[0].run.name = "resumed"
    away = (source[1], f"{source[1]} moved away")
    _spawn([*(p[:2] for p in planned.values()), whole[:2], first[:2], then],
           moves={len(planned) + 1: away, len(planned) + 2: away[::-1]})
    return {"root": root, "hf_dirs": hf_dirs, "source": source, "planned": planned, "first": first, "away": away}


def _first_batch_loss(model: torch.nn.Module, cfg: Any) -> float:
    """The loss of the run's first step, in one process: the global batch's samples all at once."""
    inputs, targets = load_micro_batch(build_source(cfg.data, cfg.model.vocab_size), range(BATCH))
    with torch.no_grad():
        logits = logits_of(model(inputs))
    return float(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1)))


def _step_loss(run_dir: str, step: int) -> float:
    return next(r["loss"] for r in read_metrics(Path(run_dir)) if r["step"] == step)


@pytest.mark.parametrize("arch, layout", HF_RUNS)
def test_fine_tuning_a_saved_hugging_face_model_starts_from_its_loss(runs: dict[str, Any], arch: str,
                                                                     layout: str) -> None:
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    cfg, run_dir, weights = runs["planned"][f"hf-{arch}-{layout}"]
    hf_dir = runs["hf_dirs"][arch]
    with safe_open(str(hf_dir / "model.safetensors"), "pt") as f:
        saved = len(list(f.keys()))
    assert weights == f"weights: from {hf_dir} ({saved} tensors)"
    expected = _first_batch_loss(AutoModelForCausalLM.from_pretrained(hf_dir), cfg)
    assert _step_loss(run_dir, 1) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("name", NATIVE_RUNS)
def test_a_saved_llama_gpt2_or_mixtral_trains_as_slurmtrains_own_model_from_its_loss(runs: dict[str, Any], name: str) -> None:
    """Converted on load (the RoPE permutation, GPT-2's Conv1D and fused q/k/v), then split by tensor parallelism,
    sharded by FSDP or replicated by DDP: the first step's loss is the Hugging Face model's on the same batch."""
    from transformers import AutoModelForCausalLM

    cfg, run_dir, weights = runs["planned"][f"native-{name}"]
    hf_dir = runs["hf_dirs"][NATIVE_RUNS[name][0]]
    assert cfg.model.get("_target_") is None and weights.startswith(f"weights: from {hf_dir} (")
    expected = _first_batch_loss(AutoModelForCausalLM.from_pretrained(hf_dir), cfg)
    assert _step_loss(run_dir, 1) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_starting_from_another_runs_fsdp_checkpoint_starts_from_its_loss(runs: dict[str, Any], layout: str) -> None:
    cfg, run_dir, weights = runs["planned"][f"ckpt-{layout}"]
    source_dir = Path(runs["source"][1])
    assert weights.startswith(f"weights: from {source_dir / 'checkpoints' / 'step_3'} (")
    assert weights.endswith(f"; the newest complete checkpoint of {source_dir})")
    model = build_model(cfg.model)
    model.load_state_dict(load_model_state(source_dir / "checkpoints" / "step_3"))
    expected = _first_batch_loss(model, cfg)
    assert _step_loss(run_dir, 1) == pytest.approx(expected, rel=1e-5)
    # Not the source run's own first step, nor a random model's: trained weights were loaded.
    assert _step_loss(run_dir, 1) < _step_loss(str(source_dir), 1) - 0.01


def test_a_resume_loads_the_runs_checkpoint_and_never_reads_init_from(runs: dict[str, Any]) -> None:
    root, source = runs["root"], Path(runs["source"][1])
    assert runs["first"][2].startswith(f"weights: from {source / 'checkpoints' / 'step_3'} (")
    resumed, whole = read_metrics(root / "resumed"), read_metrics(root / "whole")
    assert [r["step"] for r in resumed] == [1, 2]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in whole]  # bitwise an uninterrupted run
    # The plan of the same command now says where the weights come from, even with the source gone.
    os.rename(*runs["away"])
    try:
        _, _, weights = _plan(root, "resumed", *OURS, f"model.init_from={source}", "strategy=fsdp",
                              "trainer.max_steps=3")
    finally:
        os.rename(*runs["away"][::-1])
    assert weights == "weights: the run's checkpoint step_2 (model.init_from is not applied on resume)"
