"""python -m launcher.prepare ... --train-tokenizer bpe:VOCAB (issue 36, item 3): a byte-level BPE trained with the
`tokenizers` library on the documents the preparation selects and reads (the same walk, filters, decoding and skip
rules), saved as save_pretrained writes a tokenizer directory (its end-of-document token the eos_token, a chat
template when given), which AutoTokenizer loads; the dataset is prepared with it and a run trains on it. Bad
combinations are one `error:` line, exit 2, nothing created."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.data import manifest as mf
from tests.conftest import hq, launch
from tests.sft_data import TEMPLATE
from tests.unit.test_prepare import _build_corpus, _decode, prepare, prepare_printing


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("train tokenizer")
    docs = _build_corpus(root / "corpus")
    (root / "corpus" / "skipped.bin").write_bytes(b"\0binary: never read " * 50)
    (root / "chat.jinja").write_text(TEMPLATE)
    code, out, err = prepare_printing(root / "corpus", "--out", root / "ds", "--tokenizer", root / "my tok",
                                      "--train-tokenizer", "bpe:300", "--chat-template", root / "chat.jinja")
    assert code == 0, err
    return {"root": root, "docs": docs, "out": out}  # type: ignore[dict-item]


def test_the_trained_tokenizer_loads_with_transformers_and_prepares_the_data(trained: dict) -> None:
    from transformers import AutoTokenizer

    root = trained["root"]
    folder = root / "my tok"
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= {p.name for p in folder.iterdir()}
    loaded = AutoTokenizer.from_pretrained(folder)
    assert len(loaded) == 300 and loaded.eos_token == "<|endoftext|>"
    text = trained["docs"][0]
    assert loaded.decode(loaded.encode(text, add_special_tokens=False)) == text
    assert len(loaded.encode(text, add_special_tokens=False)) < len(text.encode())  # it learned merges
    assert loaded.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                      add_generation_prompt=True) == "<|user|>hi\n<|assistant|>"
    manifest = mf.load_manifest(root / "ds")
    assert manifest.tokenizer.path == str((folder / "tokenizer.json").resolve()) and manifest.tokenizer.vocab_size == 300
    assert manifest.eod_id == loaded.eos_token_id
    decoded = _decode(root / "ds", folder / "tokenizer.json")
    assert sorted(decoded["train"] + decoded["val"]) == sorted(trained["docs"])  # the binary file: skipped
    assert "trained tokenizer" in trained["out"] and "BPE of 300 tokens" in trained["out"], trained["out"]


def test_the_same_command_again_keeps_the_tokenizer_and_a_run_trains_on_it(trained: dict, tmp_path: Path) -> None:
    root = trained["root"]
    before = (root / "my tok" / "tokenizer.json").read_bytes()
    code, out, err = prepare_printing(root / "corpus", "--out", root / "ds", "--tokenizer", root / "my tok",
                                      "--train-tokenizer", "bpe:300", "--chat-template", root / "chat.jinja")
    assert code == 0 and "already complete" in out, err
    assert (root / "my tok" / "tokenizer.json").read_bytes() == before
    run = launch("model=tiny", "data=tokens", f"data.path={hq(root / 'ds')}", "model.vocab_size=300",
                 "data.seq_len=32", "trainer.max_steps=2", "trainer.ckpt_every=0", "logger.backend=none",
                 f"run.root={hq(tmp_path)}", "run.name=bpe")
    assert run.returncode == 0 and "finished at step 2" in run.stdout + run.stderr, run.stderr[-2000:]


@pytest.mark.parametrize("args, words", [
    (["--train-tokenizer", "wordpiece:300"], "--train-tokenizer wordpiece:300 is not bpe:VOCAB"),
    (["--train-tokenizer", "bpe:many"], "--train-tokenizer bpe:many is not bpe:VOCAB"),
    (["--train-tokenizer", "bpe:100"], "--train-tokenizer bpe:100: give a vocabulary of at least 258"),
    # the tokenizers trainer sized its tables by it: a Rust out-of-memory abort, exit 134, a 60-line backtrace
    (["--train-tokenizer", "bpe:10000000000"], "--train-tokenizer bpe:10000000000: give a vocabulary of at most"),
    (["--train-tokenizer", "bpe:300", "--tokenizer", "bytes"], "--train-tokenizer writes a tokenizer directory"),
    (["--chat-template", "{t}"], "--chat-template goes with --train-tokenizer"),
    (["--train-tokenizer", "bpe:300", "--chat-template", "{root}/nope.jinja"], "nope.jinja does not exist"),
    (["--train-tokenizer", "bpe:300", "--tokenizer", "{root}/taken"], "taken exists and holds no tokenizer trained"),
    (["--train-tokenizer", "bpe:300", "--prompt-field", "p", "--response-field", "r"],
     "--train-tokenizer trains on plain text"),
    # Paths that can't be written: refused before a tokenizer is trained or anything is created.
    (["--out", "{root}/corpus/a.txt/ds"], "corpus/a.txt is not a directory): give --out a directory you can write"),
    (["--train-tokenizer", "bpe:300", "--out", "{root}/corpus/a.txt/ds"], "--out"),
    (["--out", "{root}/corpus/a.txt"], "is a file: give a directory for the prepared dataset"),
    (["--train-tokenizer", "bpe:300", "--tokenizer", "{root}/corpus/a.txt/tok"], "--train-tokenizer saves the"),
    (["--train-tokenizer", "bpe:300", "--tokenizer", "{root}/corpus/a.txt"], "is a file: --train-tokenizer saves"),
])
def test_bad_combinations_are_one_line_and_create_nothing(tmp_path: Path, args: list[str], words: str) -> None:
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("some text")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    before = sorted(p for p in tmp_path.rglob("*"))
    args = [a.format(root=tmp_path, t=tmp_path / "t.jinja") for a in args]
    tokenizer = [] if "--tokenizer" in args else ["--tokenizer", str(tmp_path / "new tok")]
    code, err = prepare(tmp_path / "corpus", "--out", tmp_path / "ds", *tokenizer, *args)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and words in err, err
    assert sorted(p for p in tmp_path.rglob("*")) == before


def test_a_vocabulary_the_documents_cannot_fill_is_said(tmp_path: Path) -> None:
    """bpe:5000000 on a small corpus trained a few hundred tokens and said nothing of the size asked."""
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("a small corpus, a small vocabulary\n" * 20)
    code, out, err = prepare_printing(tmp_path / "corpus", "--out", tmp_path / "ds", "--tokenizer", tmp_path / "tok",
                                      "--train-tokenizer", "bpe:4000000")
    assert code == 0, err
    line = next(line for line in (out + err).splitlines() if line.startswith("trained tokenizer"))
    assert "bpe:4000000 asked for 4,000,000, and these documents hold no more pairs to merge" in line, line
