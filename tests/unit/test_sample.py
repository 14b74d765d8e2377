"""python -m launcher.sample: what it refuses (one error: line, exit 2, nothing written, no torch), and the run's
tokenizer found from its config. Sampling from a trained run: tests/dist/test_sample.py."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from contract.data.run_tokenizer import run_tokenizer
from launcher import sample
from tests.conftest import ROOT, launcher_env
from tests.prepared_data import write_prepared


def fake_run(root: Path, data: dict, steps: tuple[int, ...] = (4,), vocab: int = 257) -> Path:
    """A run directory whose checkpoints hold only a config and the COMPLETE marker (the checks read no more)."""
    run_dir = root / "run with space's"
    for step in steps:
        ckpt = run_dir / "checkpoints" / f"step_{step}"
        ckpt.mkdir(parents=True)
        OmegaConf.save(OmegaConf.create({"model": {"vocab_size": vocab, "max_seq_len": 16}, "data": data}),
                       ckpt / "config.yaml")
        (ckpt / "COMPLETE").write_text("{}\n")
    return run_dir


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() if p.is_file() else b"" for p in sorted(root.rglob("*"))}


def exit_code(argv: list[str]) -> int:
    """main()'s exit code: returned, or raised by the argument parser (our Parser's one-line error)."""
    try:
        return sample.main(argv)
    except SystemExit as exit:
        return int(exit.code or 0)


def refused(capsys: pytest.CaptureFixture[str], root: Path, *argv: str) -> str:
    before = snapshot(root)
    assert exit_code(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert snapshot(root) == before
    return err


@pytest.fixture
def bytes_run(tmp_path: Path) -> Path:
    write_prepared(tmp_path / "data", [list(b"abcdefgh" * 4) + [256]])
    return fake_run(tmp_path, {"name": "tokens", "path": str(tmp_path / "data")}, steps=(4, 8))


@pytest.mark.parametrize("argv, words", [
    (["{run}", "--step", "5", "--prompt", "ab"], "no complete checkpoint at step 5: pick one of [4, 8]"),
    (["{run}/nope", "--prompt", "ab"], "is not a directory"),
    (["{run}", "--prompt", ""], "--prompt is empty"),
    (["{run}", "--tokens", "1,x"], "is not a list of ids"),
    (["{run}", "--tokens", ","], "--tokens is empty"),
    (["{run}", "--tokens", "1,257"], "holds 257, outside the model's vocabulary of 257"),
    (["{run}", "--prompt", "ab", "--max-new-tokens", "0"], "--max-new-tokens 0: give 1 or more"),
    (["{run}", "--prompt", "ab", "--temperature", "-1"], "--temperature -1.0"),
    (["{run}", "--prompt", "ab", "--temperature", "nan"], "--temperature nan"),
    (["{run}", "--prompt", "ab", "--temperature", "1", "--top-k", "-2"], "--top-k -2"),
    (["{run}", "--prompt", "ab", "--top-k", "5"], "--top-k applies to sampling"),
    (["{run}"], "one of the arguments --prompt --tokens is required"),
    (["{run}", "--prompt", "a", "--tokens", "1"], "not allowed with argument"),
    (["{run}", "--prompt", "a", "--step", "x"], "invalid int value"),
])
def test_bad_inputs_are_one_line(bytes_run: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                 words: str) -> None:
    err = refused(capsys, bytes_run.parent, *[a.format(run=bytes_run) for a in argv])
    assert words in err


def test_a_run_without_checkpoints_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    err = refused(capsys, tmp_path, str(tmp_path / "empty"), "--prompt", "ab")
    assert "has no complete checkpoint: train it first" in err
    incomplete = fake_run(tmp_path, {"name": "synthetic"})
    (incomplete / "checkpoints" / "step_4" / "COMPLETE").unlink()
    assert "has no complete checkpoint" in refused(capsys, tmp_path, str(incomplete), "--tokens", "1")


@pytest.mark.parametrize("data, reason", [
    ({"name": "synthetic"}, "it trained on data=synthetic, which names no tokenizer"),
    ({"name": "tokens", "path": "{flat}"}, "it trained on data.path="),
    ({"name": "tokens", "path": "{root}/moved"}, "its prepared dataset data.path={root}/moved is not there any more"),
    ({"name": "tokens", "_target_": "mine.Data"}, "a dataset of its own (data._target_=mine.Data)"),
])
def test_prompt_needs_a_tokenizer(tmp_path: Path, capsys: pytest.CaptureFixture[str], data: dict,
                                  reason: str) -> None:
    flat = tmp_path / "tokens.bin"
    flat.write_bytes(b"\0\1" * 64)
    data = {k: v.format(flat=flat, root=tmp_path) for k, v in data.items()}
    run_dir = fake_run(tmp_path, data)
    err = refused(capsys, tmp_path, str(run_dir), "--prompt", "ab")
    assert reason.format(root=tmp_path) in err and "name one with --tokenizer T" in err
    assert "give the prompt as token ids with --tokens 1,2,3" in err


def test_bytes_tokenizer_round_trip(bytes_run: Path) -> None:
    cfg = OmegaConf.load(bytes_run / "checkpoints" / "step_8" / "config.yaml")
    tokenizer, why = run_tokenizer(cfg.data)
    assert tokenizer is not None and why == "" and tokenizer.eod_id == 256
    assert tokenizer.encode("añ") == [97, 0xC3, 0xB1]
    assert tokenizer.decode([97, 0xC3, 0xB1]) == "añ"
    assert tokenizer.decode([97, 256, 98]) == "a\ufffdb"  # no byte for the end-of-document id


def test_hf_tokenizer_from_a_mixture_and_when_it_changed(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator(["hello world, hello there"] * 20, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    file = tmp_path / "tok" / "tokenizer.json"
    file.parent.mkdir()
    tok.save(str(file))
    fingerprint = hashlib.sha256(file.read_bytes()).hexdigest()
    write_prepared(tmp_path / "data", [[1, 2, 0]], vocab=300, tokenizer=fingerprint, eod_id=0)
    # write_prepared records no path: point the manifest at the file, as launcher.prepare does.
    manifest = tmp_path / "data" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"path": null', f'"path": "{file}"'))
    data = OmegaConf.create({"name": "tokens", "path": None, "sources": {
        "flat": {"path": str(tmp_path / "data" / "train" / "00000.bin")}, "web": {"path": str(tmp_path / "data")}}})
    tokenizer, _ = run_tokenizer(data)
    assert tokenizer is not None and tokenizer.path == str(file) and tokenizer.eod_id == 0
    ids = tokenizer.encode("hello world")
    assert ids == tok.encode("hello world", add_special_tokens=False).ids and tokenizer.decode(ids) == "hello world"
    file.write_text(file.read_text().replace('"hello"', '"hullo"', 1))
    tokenizer, why = run_tokenizer(data)
    assert tokenizer is None and why == f"the tokenizer it was prepared with, {file}, has changed since"


def test_launcher_sample_stays_torch_free() -> None:
    code = "import sys, launcher.sample; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=launcher_env(), cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stderr


def test_a_checkpoint_path_names_the_run_and_its_step(bytes_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from launcher.export import run_and_step

    step_4 = bytes_run / "checkpoints" / "step_4"
    assert run_and_step(step_4, None) == (bytes_run, 4)
    assert run_and_step(step_4, 4) == (bytes_run, 4)
    assert run_and_step(bytes_run / "checkpoints", 8) == (bytes_run, 8)
    assert run_and_step(bytes_run, None) == (bytes_run, None)
    err = refused(capsys, bytes_run.parent, str(step_4), "--step", "8", "--prompt", "ab")
    assert "is the checkpoint of step 4, and --step 8 asks for another" in err


def test_chat_ids_prints_only_the_replys_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """--chat prints only the reply, as text and with --ids as ids (issue 36, item 5); without --chat, --ids
    prints the prompt's ids and the continuation's. The model is a stand-in that answers ids 6, 7 and the end of a
    document."""
    import types

    from tests.sft_data import write_tokenizer

    tok = write_tokenizer(tmp_path / "tok") / "tokenizer.json"
    write_prepared(tmp_path / "data", [[5, 6, 0]], vocab=20, tokenizer="tok", eod_id=0, tokenizer_file=tok)
    run_dir = fake_run(tmp_path, {"name": "tokens", "path": str(tmp_path / "data")}, vocab=20)
    asked: list[list[int]] = []

    def fake_sample(path: Path, model: object, ids: list[int], sampling: object) -> list[int]:
        asked.append(ids)
        return [6, 7, 0]

    fake = types.SimpleNamespace(Sampling=lambda *args, **kwargs: None, sample=fake_sample)
    monkeypatch.setattr(sample.compute_seam, "sampling", lambda: fake)
    assert sample.main([str(run_dir), "--chat", "--prompt", "shift: ab", "--ids"]) == 0
    assert capsys.readouterr().out == "6,7,0\n" and len(asked[0]) > 3
    assert sample.main([str(run_dir), "--chat", "--prompt", "shift: ab"]) == 0
    reply = capsys.readouterr().out
    assert sample.main([str(run_dir), "--prompt", "ab", "--ids"]) == 0
    assert capsys.readouterr().out == ",".join(map(str, asked[-1] + [6, 7, 0])) + "\n"
    assert reply.count("\n") == 1 and "shift" not in reply


def test_a_prompt_with_characters_the_tokenizer_lacks_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A BPE without byte fallback leaves out the characters it has no token for: the model never sees them, and
    the reply was empty with no word why. sample names them on stderr; a prompt of nothing but them is refused."""
    import types

    from contract.data.run_tokenizer import RunTokenizer
    from tests.sft_data import write_tokenizer

    tok = write_tokenizer(tmp_path / "tok") / "tokenizer.json"
    assert RunTokenizer("t", 0, str(tok)).unknown_characters("ab ☃é ab☃ z") == ["☃", "é", "z"]
    assert RunTokenizer("bytes", 256, None).unknown_characters("☃é") == []
    write_prepared(tmp_path / "data", [[5, 6, 0]], vocab=20, tokenizer="tok", eod_id=0, tokenizer_file=tok)
    run_dir = fake_run(tmp_path, {"name": "tokens", "path": str(tmp_path / "data")}, vocab=20)
    fake = types.SimpleNamespace(Sampling=lambda *args, **kwargs: None, sample=lambda *args: [6, 0])
    monkeypatch.setattr(sample.compute_seam, "sampling", lambda: fake)
    assert sample.main([str(run_dir), "--chat", "--prompt", "shift: ab☃é"]) == 0
    err = capsys.readouterr().err
    assert "has no token for '☃', 'é' of --prompt: the model does not see them" in err, err
    assert sample.main([str(run_dir), "--prompt", "ab"]) == 0
    assert "has no token" not in capsys.readouterr().err
    err = refused(capsys, tmp_path, str(run_dir), "--prompt", "☃☃")
    assert "--prompt encodes to no token at all" in err, err
