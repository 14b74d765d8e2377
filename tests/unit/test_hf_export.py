"""python -m launcher.export --format hf for slurmtrain's own transformer (issue 29): each family (a Llama-style
config with grouped-query attention and an untied head, tiny, a GPT-2-style config) loads with AutoModelForCausalLM
and AutoTokenizer from the directory alone, gives slurmtrain's logits and launcher.sample's greedy continuation, and
generate() stops at the run's end-of-document id. A corrupted mapping fails the export and leaves nothing; what no
Hugging Face class computes, or can't be written, is one `error:` line, exit 2, nothing created."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from contract.errors import ConfigError
from contract.rules import hf_native as hf_native_config
from launcher import export, sample
from tests.hf_checkpoints import FAMILIES, bytes_data, state_of, write_run
from train.weights import hf_adapters, hf_export

BOOST = (256, 3.0)  # the end-of-document id's output row scaled: some prompts end early, others run 32 tokens
PROMPTS = ["hello", "The quick brown fox", "def f(x):", "slurmtrain", "0123", "abc", "Hugging Face", "tokens",
           "export", "llama", "gpt", "zz", "#!", "import torch", "end", "ok"]
CLASSES = {"llama_gqa_untied": "LlamaForCausalLM", "tiny": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel",
           "mixtral": "MixtralForCausalLM"}


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() if p.is_file() else b"" for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf export")
    return {name: write_run(root, name, [*overrides, *bytes_data(root)], boost=BOOST)[0]
            for name, overrides in FAMILIES.items()}


@pytest.fixture(scope="module")
def exported(runs: dict[str, Path]) -> dict[str, Path]:
    for run in runs.values():
        assert export.main([str(run), "--format", "hf"]) == 0
    return {name: run / "export" / "hf_step_5" for name, run in runs.items()}


def _sampled(capsys: pytest.CaptureFixture[str], run: Path, text: str) -> list[int]:
    """launcher.sample's greedy ids after the prompt (it stops at the run's end-of-document id)."""
    capsys.readouterr()
    assert sample.main([str(run), "--prompt", text, "--max-new-tokens", "32", "--ids"]) == 0
    ids = [int(i) for i in capsys.readouterr().out.strip().split(",")]
    return ids[len(text.encode()):]


@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_loads_with_transformers_alone_and_continues_as_launcher_sample(
        exported: dict[str, Path], runs: dict[str, Path], name: str, capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from train.model.sample import Sampling, generate, load_model

    folder = exported[name]
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= {p.name for p in folder.iterdir()}
    config = json.loads((folder / "config.json").read_text())
    cfg = OmegaConf.load(runs[name] / "checkpoints" / "step_5" / "config.yaml")
    assert config["architectures"] == [CLASSES[name]] and config["vocab_size"] == 257
    assert config["tie_word_embeddings"] == cfg.model.tie_embeddings and config["eos_token_id"] == 256
    assert config.get("bos_token_id") is None and config.get("pad_token_id") is None  # bytes has neither
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == 256
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.eos_token_id == 256 and tokenizer("héllo").input_ids == list("héllo".encode())

    ours = load_model(runs[name] / "checkpoints" / "step_5", cfg.model, torch.device("cpu"))
    ids = tokenizer(PROMPTS[1] * 3, return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ours(ids), rtol=1e-4, atol=1e-4)

    # One prompt whose greedy continuation runs 32 tokens, one that ends at the end-of-document id.
    ends = {text: generate(ours, list(text.encode()), Sampling(32, stop_id=256), cfg.model.max_seq_len)
            for text in PROMPTS}
    long = next(text for text, new in ends.items() if len(new) == 32 and 256 not in new)
    short = next(text for text, new in ends.items() if len(new) < 32)
    for text in (long, short):
        inputs = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=32, do_sample=False)  # its generation_config: eos 256
        new = out[0, inputs.input_ids.shape[1]:].tolist()
        assert new == _sampled(capsys, runs[name], text), text
    assert len(new) < 32 and new[-1] == 256  # generate() stopped at the run's end of document


def test_the_export_in_bfloat16_is_sharded_past_max_shard_size(runs: dict[str, Path], tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import load_file

    out = tmp_path / "new dir" / "bf16"
    assert export.main([str(runs["tiny"]), "--format", "hf", "--dtype", "bfloat16", "--max-shard-size", "100KB",
                        "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "LlamaForCausalLM in bfloat16, 3 safetensors files" in err and "export: verified: logits within" in err
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) == 3 and all((out / s).stat().st_size <= 100_000 for s in shards)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    written = {k: v for s in shards for k, v in load_file(out / s).items()}
    cfg = OmegaConf.load(runs["tiny"] / "checkpoints" / "step_5" / "config.yaml")
    expected = hf_adapters.adapter(cfg.model).to_hf(state_of(runs["tiny"]))
    assert set(written) == set(expected) - {"lm_head.weight"}  # tied: stored once
    for key, tensor in written.items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, expected[key].to(torch.bfloat16)), key


def _drop_k_permutation(monkeypatch: pytest.MonkeyPatch) -> None:
    original = hf_adapters.LlamaAdapter.to_hf

    def to_hf(self: Any, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = original(self, state)
        for name, tensor in state.items():
            if name.endswith("attn.k.weight"):
                out[f"model.layers.{name.split('.')[1]}.self_attn.k_proj.weight"] = tensor
        return out

    monkeypatch.setattr(hf_adapters.LlamaAdapter, "to_hf", to_hf)


def _swap_q_and_k(monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v = hf_adapters.GPT2Adapter.QKV
    monkeypatch.setattr(hf_adapters.GPT2Adapter, "QKV", (k, q, v))


def _default_rope_theta(monkeypatch: pytest.MonkeyPatch) -> None:
    original = hf_native_config.hf_config

    def hf_config(model: Any) -> dict[str, Any]:
        out = original(model)
        out["rope_parameters"] = {"rope_theta": 10000.0, "rope_type": "default"}
        return out

    monkeypatch.setattr(hf_native_config, "hf_config", hf_config)


CORRUPTIONS = {  # (family, fresh init, the corruption)
    "k not permuted": ("llama_gqa_untied", False, _drop_k_permutation),
    "k not permuted, untrained": ("tiny", True, _drop_k_permutation),
    "q and k swapped in c_attn": ("gpt2", False, _swap_q_and_k),
    "rope theta not carried": ("llama_gqa_untied", False, _default_rope_theta),
}


@pytest.mark.parametrize("case", CORRUPTIONS)
def test_a_corrupted_mapping_fails_the_export_and_leaves_nothing(tmp_path: Path, case: str,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Even an untrained model's (attention nearly uniform, where a short check scores a wrong permutation's KL at
    some 5e-6): the logits compared in float32 move far past the tolerance."""
    name, fresh, corrupt = CORRUPTIONS[case]
    run, _ = write_run(tmp_path, name, [*FAMILIES[name], *bytes_data(tmp_path)], sharp=not fresh)
    corrupt(monkeypatch)
    before = snapshot(tmp_path)
    assert export.main([str(run), "--format", "hf"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: the Hugging Face directory did not reproduce the run's "
                                                   "model: the logits differ by up to "), err
    assert "nothing was written" in err
    assert snapshot(tmp_path) == before  # no export/, no partial directory


@pytest.mark.parametrize("overrides, args, words", [
    (["model.position=learned"], [], "no Hugging Face class computes model.position=learned"),
    ([*FAMILIES["gpt2"], "model.n_kv_heads=2"], [], "grouped-query attention"),
    (["model=moe_tiny", "model.moe.shared_experts=1"], [], "a mixture of experts with model.moe.shared_experts=1 has "
                                                           "no Hugging Face class"),
    ([], ["--dtype", "float16"], "--dtype float16 can't hold model.layers.0.self_attn.q_proj.weight (|values| up to 1e+06)"),
    ([], ["--no-verify"], "--no-verify is for a model whose check does not fit in memory"),
    ([], ["--max-shard-size", "5 apples"], "--max-shard-size '5 apples' is not a size"),
    ([], ["--format", "safetensors", "--max-shard-size", "5GB"], "--max-shard-size applies to --format hf"),
])
def test_what_cannot_be_exported_is_one_line_and_nothing_is_written(tmp_path: Path, overrides: list[str],
                                                                    args: list[str], words: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    run, _ = write_run(tmp_path, "run", overrides)
    if "float16" in args:  # a weight past float16's range
        state = state_of(run)
        state["blocks.0.attn.q.weight"][0, 0] = 1e6
        run, _ = write_run(tmp_path, "big", overrides, state=state)
    before = snapshot(tmp_path)
    assert export.main([str(run), "--format", "hf", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and words in err, err
    assert snapshot(tmp_path) == before


def test_a_model_of_its_own_is_refused_for_hf_before_its_weights_are_read(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    step = tmp_path / "run" / "checkpoints" / "step_5"
    step.mkdir(parents=True)
    (step / "COMPLETE").write_text("{}\n")
    OmegaConf.save(OmegaConf.create({"model": {"name": "mine", "_target_": "my_pkg.build"}, "data": {}}),
                   step / "config.yaml")
    assert export.main([str(tmp_path / "run"), "--format", "hf"]) == 2
    assert capsys.readouterr().err == ("error: --format hf takes slurmtrain's transformer or model=hf_causal_lm, and "
                                       "this run's model is model._target_=my_pkg.build: --format safetensors "
                                       "exports it as it is\n")


@pytest.mark.parametrize("overrides, words", [
    (["model.position=learned"], "checkpoint.export_hf=true: no Hugging Face class computes model.position=learned"),
    (["model._target_=tests.fixtures.user_models.TinyLM"], "checkpoint.export_hf=true takes slurmtrain's transformer"),
])
def test_export_hf_at_the_end_is_refused_at_launch_for_a_model_no_class_computes(overrides: list[str],
                                                                                  words: str) -> None:
    from launcher.compose import compose_and_plan

    with pytest.raises(ConfigError, match="drop it, and export checkpoints with python -m launcher.export "
                                          "--format safetensors") as refused:
        compose_and_plan([*overrides, "checkpoint.export_hf=true", "launcher.dry_run=true"])
    assert str(refused.value).startswith(words)


def test_no_verify_writes_an_unchecked_export_when_the_check_does_not_fit(runs: dict[str, Path], tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(hf_export, "host_memory_available", lambda: 1000)  # bytes: nothing fits
    assert export.main([str(runs["gpt2"]), "--format", "hf", "--out", str(tmp_path / "a")]) == 2
    assert "verifying the export needs about 0.0 GiB of the 0.0 GiB available" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    assert export.main([str(runs["gpt2"]), "--format", "hf", "--no-verify", "--out", str(tmp_path / "a")]) == 0
    assert "export: not verified (--no-verify)" in capsys.readouterr().err
    assert (tmp_path / "a" / "model.safetensors").is_file()


def test_a_hugging_face_run_exports_with_the_runs_tokenizer(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """model=hf_causal_lm exports had neither tokenizer nor eos_token_id; they are verified like ours."""
    from transformers import AutoTokenizer

    config = json.loads((Path(__file__).parents[1] / "fixtures" / "tiny_llama" / "config.json").read_text())
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({**config, "vocab_size": 257}))
    run, _ = write_run(tmp_path, "hf", ["model=hf_causal_lm", f"model.config_path={tmp_path / 'llama'}",
                                        *bytes_data(tmp_path)])
    assert export.main([str(run), "--format", "hf"]) == 0
    err = capsys.readouterr().err
    assert "tokenizer bytes, eos_token_id 256" in err and "export: verified: logits within" in err
    folder = run / "export" / "hf_step_5"
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == 256
    assert AutoTokenizer.from_pretrained(folder).encode("ab", add_special_tokens=False) == [97, 98]


def test_a_prepared_tokenizer_json_and_a_padded_vocabulary_come_along(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A Hugging Face tokenizer.json (BPE trained here) is the export's tokenizer, its end-of-document token the
    eos_token; the model's vocabulary padded past the tokenizer's (as gpt2_124m's 50304 rows for 50257 tokens) is
    config.json's vocab_size, rows kept."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.prepared_data import write_prepared

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer, tokenizer.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tokenizer.train_from_iterator(PROMPTS * 20, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    eod, vocab = tokenizer.token_to_id("<|endoftext|>"), tokenizer.get_vocab_size()
    write_prepared(tmp_path / "bpe data", [tokenizer.encode(" ".join(PROMPTS)).ids * 30 + [eod]], vocab=vocab,
                   tokenizer="tokenizer.json", eod_id=eod, tokenizer_file=tmp_path / "tokenizer.json")
    run, _ = write_run(tmp_path, "bpe", ["data=tokens", f"data.path={tmp_path / 'bpe data'}",
                                         f"model.vocab_size={vocab + 40}"])
    assert export.main([str(run), "--format", "hf"]) == 0
    assert f"tokenizer tokenizer.json, eos_token_id {eod}" in capsys.readouterr().err
    folder = run / "export" / "hf_step_5"
    loaded = AutoTokenizer.from_pretrained(folder)
    text = "def f(x): the quick brown fox"
    assert loaded.encode(text, add_special_tokens=False) == tokenizer.encode(text).ids
    assert loaded.eos_token == "<|endoftext|>" and loaded.eos_token_id == eod
    assert json.loads((folder / "config.json").read_text())["vocab_size"] == vocab + 40
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.get_input_embeddings().weight.shape[0] == vocab + 40
    assert torch.equal(model.get_input_embeddings().weight, state_of(run)["embed.weight"])  # padded rows kept


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny run prepared with a tokenizer whose chat template is tokenizer_config.json's key (issue 36, item 1)."""
    from tests.prepared_data import write_prepared
    from tests.sft_data import SPECIALS, write_tokenizer

    root = tmp_path_factory.mktemp("chat export")
    tok = write_tokenizer(root / "chat tok") / "tokenizer.json"
    write_prepared(root / "chat data", [[5, 6, 7, 0] * 40], vocab=20, tokenizer="chat tok", eod_id=0,
                   tokenizer_file=tok)
    assert SPECIALS[0] == "<|end|>"  # id 0: the end-of-document token the tokenizer_config.json names
    run, _ = write_run(root, "chat", ["data=tokens", f"data.path={root / 'chat data'}", "model.vocab_size=20"])
    return run


def test_a_chat_tokenizers_export_chats_as_launcher_sample_chat_encodes(
        chat_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The export carries the chat template as transformers writes it, so apply_chat_template works from the
    directory alone and encodes the chat `launcher.sample --chat` encodes; config.json's special ids are the
    tokenizer's own (no start token here: null, not LlamaConfig's default 1)."""
    from transformers import AutoTokenizer

    from contract.data.run_tokenizer import run_tokenizer
    from contract.data.sft import chat_template

    assert export.main([str(chat_run), "--format", "hf"]) == 0
    assert "the chat template renders as launcher.sample --chat encodes" in capsys.readouterr().err
    folder = chat_run / "export" / "hf_step_5"
    loaded = AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "user", "content": "shift: abc"}]
    theirs = loaded.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    cfg = OmegaConf.load(chat_run / "checkpoints" / "step_5" / "config.yaml")
    run, _ = run_tokenizer(cfg.data)
    assert run is not None
    template = chat_template(run.path)
    assert template is not None
    user, assistant = run.encode("<|user|>"), run.encode("<|assistant|>")
    assert list(theirs) == run.encode(template.prompt("shift: abc")) == [*user, *run.encode("shift: abc\n"), *assistant]
    config = json.loads((folder / "config.json").read_text())
    assert config["eos_token_id"] == 0 and config["bos_token_id"] is None and config["pad_token_id"] is None
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == 0


def test_a_chat_template_the_export_renders_otherwise_fails_the_export(
        chat_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from train.weights import hf_tokenizer

    original = hf_tokenizer.fast_tokenizer

    def other_template(*args: Any, **kwargs: Any) -> Any:
        fast = original(*args, **kwargs)
        fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        return fast

    monkeypatch.setattr(hf_tokenizer, "fast_tokenizer", other_template)
    assert export.main([str(chat_run), "--format", "hf", "--out", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err
    assert "apply_chat_template encodes" in err and "launcher.sample --chat" in err, err
    assert not (tmp_path / "x").exists() and list(tmp_path.iterdir()) == []


def test_the_launch_plan_warns_when_the_model_cannot_be_exported_to_hugging_face() -> None:
    """Issue 36, item 13: a run of hours finds out only at launcher.export --format hf; the plan says so at launch,
    in one line, and the families Hugging Face has get no such line."""
    from launcher.compose import compose_and_plan

    _, plan = compose_and_plan(["model=tiny", "model.position=learned", "launcher.dry_run=true"])
    warnings = [line for line in plan.summary().splitlines() if "Hugging Face" in line]
    assert len(warnings) == 1 and warnings[0].strip().startswith("warning: launcher.export --format hf will refuse"), \
        plan.summary()
    assert "no Hugging Face class computes model.position=learned" in warnings[0]
    hf_model = ["model=hf_causal_lm", f"model.config_path={Path(__file__).parents[1] / 'fixtures' / 'tiny_llama'}"]
    for family in (["model=tiny"], ["model=tiny", *FAMILIES["gpt2"]], hf_model):
        _, plan = compose_and_plan([*family, "launcher.dry_run=true"])
        assert "Hugging Face" not in plan.summary(), family
