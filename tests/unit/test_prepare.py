"""python -m launcher.prepare: corpus -> token shards + manifest (issue 20)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from contract.data import manifest as mf
from contract.errors import ConfigError
from tests.prepared_data import write_prepared

# ---------------------------------------------------------------- the format (contract/data/manifest.py)


def test_manifest_round_trip(tmp_path: Path) -> None:
    written = write_prepared(tmp_path, [[1, 2, 256], [3, 256]], [[4, 4, 256]])
    assert mf.is_prepared_dir(tmp_path) and not mf.is_prepared_dir(tmp_path / "train")
    loaded = mf.load_manifest(tmp_path)
    assert loaded == written
    assert (
        loaded.dtype == "uint16" and loaded.split("train").tokens == 5 and loaded.split("val").documents == 1
    )
    stream = np.concatenate([np.fromfile(f, dtype=loaded.np_dtype) for f in loaded.shard_files("train")])
    assert stream.tolist() == [1, 2, 256, 3, 256]
    assert json.loads((tmp_path / mf.MANIFEST).read_text())["format"] == mf.FORMAT
    assert not list(tmp_path.glob("*.tmp*"))


def test_dtype_follows_the_vocabulary() -> None:
    assert mf.dtype_for_vocab(257) == "uint16" and mf.dtype_for_vocab(65536) == "uint16"
    assert mf.dtype_for_vocab(65537) == "uint32"


def test_fingerprint_changes_with_any_shard(tmp_path: Path) -> None:
    a = write_prepared(tmp_path / "a", [[1, 256]], [])
    b = write_prepared(tmp_path / "b", [[2, 256]], [])
    c = write_prepared(tmp_path / "c", [[1, 256]], [])
    assert a.fingerprint == c.fingerprint != b.fingerprint


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda root: (root / mf.MANIFEST).unlink(), "no manifest.json"),
        (lambda root: (root / mf.MANIFEST).write_text("{"), "is damaged"),
        (
            lambda root: (root / mf.MANIFEST).write_text(
                (root / mf.MANIFEST).read_text().replace('"tokens": 3', '"tokens": 4', 1)
            ),
            "is damaged",
        ),
        (lambda root: (root / "train/00000.bin").unlink(), "which is missing"),
        (lambda root: (root / "train/00000.bin").write_bytes(b"\0"), "holds 1 bytes"),
    ],
)
def test_load_manifest_refuses_what_is_not_a_dataset(tmp_path: Path, damage, words: str) -> None:
    write_prepared(tmp_path, [[1, 2, 256]], [])
    damage(tmp_path)
    with pytest.raises(ConfigError, match=words) as err:
        mf.load_manifest(tmp_path)
    assert "\n" not in str(err.value) and "launcher.prepare" in str(err.value)


# ---------------------------------------------------------------- python -m launcher.prepare

WORDS = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
    "upsilon phi chi psi omega ünïcödé 東京 😀"
).split()


def _doc(i: int) -> str:
    words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(3 + i % 11)]
    return f"doc {i}: " + " ".join(words) + ("\nsecond line." if i % 4 == 0 else "")


def _jsonl(docs: list[str]) -> bytes:
    return "".join(json.dumps({"id": n, "text": d}) + "\n" for n, d in enumerate(docs)).encode()


def _build_corpus(root: Path, start: int = 0) -> list[str]:
    """Text (a document per file), JSON Lines, Parquet, a .gz and a .zst; returns the documents in the order the
    preparation reads them (files sorted by path)."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    ids = iter(range(start, start + 1000))
    files: dict[str, list[str]] = {}
    (root / "sub").mkdir(parents=True)
    for name in ("a.txt", "b.md", "sub/c.txt"):
        doc = _doc(next(ids))
        (root / name).write_text(doc, encoding="utf-8")
        files[name] = [doc]
    files["d.jsonl"] = [_doc(next(ids)) for _ in range(12)]
    files["d.jsonl"][3] += " a literal <|endoftext|> and <pad> in the text stay text"
    (root / "d.jsonl").write_bytes(
        _jsonl(files["d.jsonl"]).replace(b"\n", b"\n\n", 1)
    )  # a blank line is skipped
    files["e.jsonl.gz"] = [_doc(next(ids)) for _ in range(10)]
    (root / "e.jsonl.gz").write_bytes(gzip.compress(_jsonl(files["e.jsonl.gz"])))
    files["f.jsonl.zst"] = [_doc(next(ids)) for _ in range(10)]
    (root / "f.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(_jsonl(files["f.jsonl.zst"])))
    files["g.parquet"] = [_doc(next(ids)) for _ in range(12)]
    pq.write_table(
        pa.table({"text": files["g.parquet"], "n": list(range(12))}), root / "g.parquet", row_group_size=5
    )
    doc = _doc(next(ids))
    (root / "h.txt.gz").write_bytes(gzip.compress(doc.encode()))
    files["h.txt.gz"] = [doc]
    (root / ".hidden.txt").write_text("never read")
    (root / "sub" / "__pycache__").mkdir()
    (root / "sub" / "__pycache__" / "c.cpython-311.pyc").write_bytes(b"\x00\xff never read")
    return [d for name in sorted(files, key=lambda n: str(root / n)) for d in files[name]]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE trained here (no network), with <|endoftext|> as its end of document."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<pad>", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_doc(i) for i in range(300)], trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def prepare(*args: object, workers: int = 1) -> tuple[int, str]:
    """python -m launcher.prepare in this process: (exit code, stderr)."""
    code, _, err = prepare_printing(*args, workers=workers)
    return code, err


def prepare_printing(*args: object, workers: int = 1) -> tuple[int, str, str]:
    """python -m launcher.prepare in this process: (exit code, stdout, stderr)."""
    import contextlib
    import io

    from launcher.prepare.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main([str(a) for a in args] + ["--workers", str(workers)])
        except SystemExit as exit_:  # argparse's own refusals
            code = int(exit_.code or 0)
    return code, out.getvalue(), err.getvalue()


def _decode(path: Path, tokenizer: Path | None) -> dict[str, list[str]]:
    """Each split's documents, decoded back from its shards (end-of-document ids between them)."""
    manifest = mf.load_manifest(path)
    if tokenizer is not None:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tokenizer))
    docs: dict[str, list[str]] = {}
    for split in mf.SPLITS:
        files = manifest.shard_files(split)
        stream = (
            np.concatenate([np.fromfile(f, dtype=manifest.np_dtype) for f in files])
            if files
            else np.array([])
        )
        assert len(stream) == manifest.split(split).tokens
        assert len(stream) == 0 or stream[-1] == manifest.eod_id  # every document ends with the eod id
        ends = np.flatnonzero(stream == manifest.eod_id)
        pieces = np.split(stream, ends + 1)[:-1]
        ids = [p[:-1].tolist() for p in pieces]
        if tokenizer is None:
            docs[split] = [bytes(x).decode("utf-8") for x in ids]
        else:
            docs[split] = [tok.decode(x, skip_special_tokens=False) for x in ids]
        assert len(docs[split]) == manifest.split(split).documents
    return docs


def _tree(root: Path) -> dict[str, bytes]:
    """Every file of a prepared dataset but the plan (which names its directory) and the lock."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in ("plan.json", "lock")
    }


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_shards_decode_back_to_the_documents(tmp_path: Path, bpe: Path, tokenizer: str) -> None:
    docs = _build_corpus(tmp_path / "corpus")
    tok = bpe if tokenizer == "bpe" else None
    code, err = prepare(
        tmp_path / "corpus",
        "--out",
        tmp_path / "out",
        "--tokenizer",
        tok or "bytes",
        "--val-fraction",
        0.3,
        "--task-mb",
        0.0001,
    )
    assert code == 0, err
    manifest = mf.load_manifest(tmp_path / "out")
    got = _decode(tmp_path / "out", tok)
    assert got["train"] and got["val"]
    assert set(got["train"]).isdisjoint(got["val"])
    assert sorted(got["train"] + got["val"]) == sorted(docs)
    for split in mf.SPLITS:  # within a split, the input order
        assert got[split] == [d for d in docs if d in set(got[split])]
    assert "never read" not in got["train"] + got["val"]
    if tok is None:
        assert (manifest.tokenizer.vocab_size, manifest.eod_id, manifest.dtype) == (257, 256, "uint16")
    else:
        from tokenizers import Tokenizer

        t = Tokenizer.from_file(str(bpe))
        assert manifest.eod_id == t.token_to_id("<|endoftext|>") and manifest.tokenizer.vocab_size == 400
        assert manifest.tokenizer.fingerprint == "sha256:" + hashlib.sha256(bpe.read_bytes()).hexdigest()
        assert manifest.tokenizer.path == str(bpe)
    assert [s.path for s in manifest.sources] == sorted(
        str(p)
        for p in (tmp_path / "corpus").rglob("*")
        if p.is_file() and not p.name.startswith(".") and "__pycache__" not in p.parts
    )
    assert sum(s.documents for s in manifest.sources) == len(docs)
    assert len(manifest.split("train").shards) > 1  # several tasks


def test_split_is_stable_when_a_file_is_added(tmp_path: Path) -> None:
    _build_corpus(tmp_path / "corpus")
    args = ("--tokenizer", "bytes", "--val-fraction", 0.3)
    assert prepare(tmp_path / "corpus", "--out", tmp_path / "one", *args)[0] == 0
    (tmp_path / "corpus" / "more.jsonl").write_bytes(_jsonl([_doc(i) for i in range(500, 540)]))
    assert prepare(tmp_path / "corpus", "--out", tmp_path / "two", *args)[0] == 0
    one, two = _decode(tmp_path / "one", None), _decode(tmp_path / "two", None)
    assert set(one["train"]) < set(two["train"]) and set(one["val"]) < set(two["val"])
    # another seed, another split of the same documents
    assert prepare(tmp_path / "corpus", "--out", tmp_path / "three", *args, "--split-seed", 1)[0] == 0
    three = _decode(tmp_path / "three", None)
    assert set(three["val"]) != set(two["val"]) and sorted(three["val"] + three["train"]) == sorted(
        two["val"] + two["train"]
    )


def test_output_is_the_same_for_any_number_of_workers(tmp_path: Path, bpe: Path) -> None:
    _build_corpus(tmp_path / "corpus")
    args = (tmp_path / "corpus", "--tokenizer", bpe, "--val-fraction", 0.2, "--task-mb", 0.0001)
    assert prepare(*args, "--out", tmp_path / "w1", workers=1)[0] == 0
    assert prepare(*args, "--out", tmp_path / "w2", workers=2)[0] == 0
    one, two = _tree(tmp_path / "w1"), _tree(tmp_path / "w2")
    assert one == two and "manifest.json" in one and len(one) > 10


def _stats(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in ("lock", "manifest.json")
    }


def test_a_killed_preparation_resumes_writing_only_the_missing_shards(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from launcher.prepare.shards import KILL_AT_TASK_ENV

    _build_corpus(tmp_path / "corpus")
    args = [str(tmp_path / "corpus"), "--tokenizer", "bytes", "--task-mb", "0.0001", "--val-fraction", "0.3"]
    out = tmp_path / "out"
    env = {**os.environ, KILL_AT_TASK_ENV: "3"}
    killed = subprocess.run(
        [sys.executable, "-m", "launcher.prepare", *args, "--out", str(out), "--workers", "1"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -9, killed.stderr
    assert not (out / mf.MANIFEST).exists()
    assert sorted(p.name for p in (out / ".parts").glob("0*.json")) == [
        "00000.json",
        "00001.json",
        "00002.json",
    ]
    assert list(out.rglob("00003.bin.tmp-*"))  # the shard it was writing, never renamed into place
    before = _stats(out)
    code, err = prepare(*args, "--out", out)
    assert code == 0, err
    after = _stats(out)
    kept = {k: v for k, v in before.items() if ".tmp-" not in k}
    assert kept and all(after[k] == v for k, v in kept.items())  # finished tasks untouched
    assert not list(out.rglob("*.tmp-*"))
    assert "00003.json" in {Path(k).name for k in after.keys() - before.keys()}
    # the same bytes as a preparation never interrupted
    assert prepare(*args, "--out", tmp_path / "clean")[0] == 0
    assert _tree(out) == _tree(tmp_path / "clean")

    # a task's shard deleted (its record kept), another task's record deleted: only those two are written
    (out / "train/00001.bin").unlink()
    (out / ".parts/00004.json").unlink()
    before = _stats(out)
    code, err = prepare(*args, "--out", out, workers=2)
    assert code == 0, err
    after = _stats(out)
    rewritten = {k for k in before if before[k] != after[k]} | (after.keys() - before.keys())
    assert {Path(k).name for k in rewritten} <= {"00001.bin", "00001.json", "00004.bin", "00004.json"}
    assert {"train/00001.bin", ".parts/00001.json", ".parts/00004.json"} <= rewritten
    assert _tree(out) == _tree(tmp_path / "clean")
    # complete: running it again writes nothing
    code, err = prepare(*args, "--out", out)
    assert code == 0 and _stats(out) == after


def test_text_per_line_and_a_vocabulary_past_uint16(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(70000)} | {"<unk>": 70000, "</s>": 70001}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (tmp_path / "tok").mkdir()
    tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    (tmp_path / "lines.txt").write_text("w1 w69999\n\nw5\r\nw65536 w7\n")
    code, err = prepare(
        tmp_path / "lines.txt",
        "--text-per-line",
        "--out",
        tmp_path / "out",
        "--tokenizer",
        tmp_path / "tok",
        "--val-fraction",
        0,
    )
    assert code == 0, err
    manifest = mf.load_manifest(tmp_path / "out")
    assert manifest.dtype == "uint32" and manifest.eod_id == 70001 and manifest.tokenizer.name == "tok"
    assert not manifest.split("val").shards
    stream = np.fromfile(manifest.shard_files("train")[0], dtype="<u4").tolist()
    assert stream == [1, 69999, 70001, 5, 70001, 65536, 7, 70001]


def test_eod_token_named_or_refused(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"a": 0, "b": 1, "<u>": 2, "[END]": 3}, unk_token="<u>")).save(
        str(tmp_path / "t.json")
    )
    (tmp_path / "x.txt").write_text("a b")
    code, err = prepare(tmp_path / "x.txt", "--out", tmp_path / "out", "--tokenizer", tmp_path / "t.json")
    assert code == 2 and err.startswith("error:") and "--eod-token" in err and not (tmp_path / "out").exists()
    code, err = prepare(
        tmp_path / "x.txt",
        "--out",
        tmp_path / "out",
        "--tokenizer",
        tmp_path / "t.json",
        "--eod-token",
        "[END]",
    )
    assert code == 0, err
    assert mf.load_manifest(tmp_path / "out").eod_id == 3


def test_output_inside_the_input_directory_is_not_read(tmp_path: Path) -> None:
    _build_corpus(tmp_path / "corpus")
    args = (tmp_path / "corpus", "--out", tmp_path / "corpus" / "prepared", "--tokenizer", "bytes")
    assert prepare(*args)[0] == 0
    code, err = prepare(*args)  # the shards just written are not new inputs: the same preparation
    assert code == 0, err
    glob_args = (str(tmp_path / "corpus" / "*.jsonl*"), "--out", tmp_path / "globbed", "--tokenizer", "bytes")
    assert prepare(*glob_args)[0] == 0
    assert len(mf.load_manifest(tmp_path / "globbed").sources) == 3


# ---------------------------------------------------------------- bad input: one line, exit 2, nothing left


def _corrupt(corpus: Path, what: str) -> None:
    if what == "jsonl without the field":
        (corpus / "z.jsonl").write_text('{"text": "fine"}\n{"body": "no text"}\n')
    elif what == "not JSON":
        (corpus / "z.jsonl").write_text('{"text": "fine"}\n{"text": \n')
    elif what == "truncated gz":
        import gzip

        (corpus / "z.txt.gz").write_bytes(gzip.compress(bytes(range(256)) * 40)[:300])
    elif what == "not UTF-8":
        (corpus / "z.txt").write_bytes(b"caf\xe9 au lait")
    elif what == "JSON Lines not UTF-8":
        (corpus / "z.jsonl").write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    elif what == "parquet without the column":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"content": ["x"]}), corpus / "z.parquet")


STRICT = ("--encoding-errors", "strict")  # text that is not UTF-8 in a directory is skipped unless asked


@pytest.mark.parametrize(
    "what, extra, words",
    [
        # found in a directory: the --exclude that leaves it out (or every file of its format) is named too
        # a bad line past the first record is this file's alone: '*.jsonl' would leave the good files out too
        ("jsonl without the field", (), ["z.jsonl line 2 has no field 'text'", "--text-field",
                                         "leave it out with --exclude z.jsonl"]),
        ("not JSON", (), ["z.jsonl line 2 is not JSON", "leave it out with --exclude z.jsonl"]),
        # (without --strict a truncated .gz found is skipped: test_a_tree_skips_compressed_files_it_cannot_read...)
        ("truncated gz", ("--strict",), ["cannot read", "z.txt.gz", "leave them out with --exclude z.txt.gz"]),
        ("not UTF-8", STRICT, ["z.txt is not UTF-8 text", "iconv", "--encoding-errors skip"]),
        ("JSON Lines not UTF-8", STRICT, ["z.jsonl is not UTF-8 text at line 2", "--encoding-errors skip"]),
        ("parquet without the column", (), ["z.parquet has no column 'text' (it has content)", "--text-field"]),
    ],
)
def test_a_bad_input_file_is_one_line_and_leaves_nothing(
    tmp_path: Path, what: str, extra: tuple[str, ...], words: list[str]
) -> None:
    _build_corpus(tmp_path / "corpus")  # good files first: their tasks finish, then are removed again
    _corrupt(tmp_path / "corpus", what)
    out = tmp_path / "new" / "out"
    code, err = prepare(tmp_path / "corpus", "--out", out, "--tokenizer", "bytes", "--task-mb", 0.0001, *extra)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert all(w in err for w in words), err
    assert not (tmp_path / "new").exists()


def test_a_bad_input_in_a_resumed_directory_removes_only_what_that_run_wrote(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from launcher.prepare.shards import KILL_AT_TASK_ENV

    _build_corpus(tmp_path / "corpus")
    _corrupt(tmp_path / "corpus", "jsonl without the field")  # z.jsonl: the last task
    out = tmp_path / "out"
    args = [str(tmp_path / "corpus"), "--tokenizer", "bytes", "--task-mb", "0.0001", "--out", str(out)]
    killed = subprocess.run(
        [sys.executable, "-m", "launcher.prepare", *args, "--workers", "1"],
        env={**os.environ, KILL_AT_TASK_ENV: "2"},
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -9, killed.stderr
    kept = {k: v for k, v in _stats(out).items() if ".tmp-" not in k}
    code, err = prepare(*args, workers=2)  # resumes tasks 2.., meets z.jsonl
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and "z.jsonl line 2" in err, err
    assert _stats(out) == kept  # the killed run's finished tasks stay; nothing of this run does
    (tmp_path / "given").mkdir()  # an empty directory given as --out stays, empty
    code, err = prepare(*args[:-1], tmp_path / "given")
    assert code == 2 and list((tmp_path / "given").iterdir()) == []


@pytest.mark.parametrize(
    "case, words",
    [
        ("missing input", ["does not exist"]),
        ("empty glob", ["no file matches"]),
        ("missing tokenizer", ["tokenizer", "does not exist", "bytes"]),
        ("not a tokenizer", ["is not a Hugging Face tokenizer.json"]),
        ("directory without tokenizer.json", ["holds no tokenizer.json"]),
        ("eod token for bytes", ["--eod-token does not apply"]),
        ("val fraction", ["--val-fraction 1.5"]),
        ("unknown option", ["unrecognized arguments: --nope"]),
        ("out is not ours", ["is not empty and holds no prepared dataset"]),
        ("unknown cluster", ["no cluster named 'nope'", "local_slurm"]),
        ("cluster key", ["cluster local_slurm", "nodez"]),
        ("cluster override without a cluster", ["cluster.partition=cpu needs +cluster=NAME"]),
    ],
)
def test_bad_arguments_are_one_line_and_create_nothing(tmp_path: Path, case: str, words: list[str]) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("some text")
    (tmp_path / "notes.txt").write_text("not a tokenizer")
    out = tmp_path / "out"
    args: list[object] = [corpus, "--out", out, "--tokenizer", "bytes"]
    if case == "missing input":
        args[0] = tmp_path / "nope"
    elif case == "empty glob":
        args[0] = str(corpus / "*.parquet")
    elif case == "missing tokenizer":
        args[-1] = "gpt2"
    elif case == "not a tokenizer":
        args[-1] = tmp_path / "notes.txt"
    elif case == "directory without tokenizer.json":
        args[-1] = corpus
    elif case == "eod token for bytes":
        args += ["--eod-token", "</s>"]
    elif case == "val fraction":
        args += ["--val-fraction", "1.5"]
    elif case == "unknown option":
        args += ["--nope"]
    elif case == "unknown cluster":
        args += ["+cluster=nope"]
    elif case == "cluster key":
        args += ["+cluster=local_slurm", "cluster.nodez=2"]
    elif case == "cluster override without a cluster":
        args += ["cluster.partition=cpu"]
    elif case == "out is not ours":
        out.mkdir()
        (out / "mine.txt").write_text("keep me")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code, err = prepare(*args)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert all(w in err for w in words), err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_different_preparation_in_out_is_refused_unless_overwrite(tmp_path: Path, bpe: Path) -> None:
    _build_corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    assert prepare(tmp_path / "corpus", "--out", out, "--tokenizer", "bytes")[0] == 0
    files = _tree(out)
    for change, words in [
        (["--tokenizer", bpe], "prepared with the tokenizer bytes"),
        (["--tokenizer", "bytes", "--text-per-line"], "prepared without --text-per-line"),
        (["--tokenizer", "bytes", "--val-fraction", "0.1"], "prepared with --val-fraction 0.005, not 0.1"),
    ]:
        code, err = prepare(tmp_path / "corpus", "--out", out, *change)
        assert code == 2 and err.count("\n") == 1 and "already holds a different preparation" in err, err
        assert words in err and "--overwrite" in err
        assert _tree(out) == files
    (tmp_path / "corpus" / "new.txt").write_text("one more document")
    code, err = prepare(tmp_path / "corpus", "--out", out, "--tokenizer", "bytes")
    assert code == 2 and "new.txt is new" in err and _tree(out) == files
    code, err = prepare(tmp_path / "corpus", "--out", out, "--tokenizer", bpe, "--overwrite")
    assert code == 0, err
    assert mf.load_manifest(out).tokenizer.name == bpe.parent.name
    assert "one more document" in _decode(out, bpe)["train"] + _decode(out, bpe)["val"]


def test_worker_processes_only_where_they_pay_off() -> None:
    from launcher.prepare.pool import AUTO_MB_PER_WORKER, cpu_count, worker_count

    mb = int(AUTO_MB_PER_WORKER * 2**20)
    assert worker_count(None, 5 * 2**20, 16) == 1  # a small corpus: the tokenizer's threads in one process
    assert worker_count(None, 3 * mb, 16) == min(cpu_count(), 3)
    assert worker_count(None, 1000 * mb, 2) == min(cpu_count(), 2)  # never more than the tasks
    assert worker_count(2, 10, 16) == 2 and worker_count(8, 10**12, 3) == 3  # --workers N as given


def test_a_directory_another_preparation_is_writing_is_refused(tmp_path: Path) -> None:
    import fcntl
    import os

    _build_corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    assert prepare(tmp_path / "corpus", "--out", out, "--tokenizer", "bytes")[0] == 0
    files = _tree(out)
    fd = os.open(out, os.O_RDONLY)  # what a running preparation holds
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for extra in ([], ["--overwrite", "--val-fraction", "0.5"]):
            code, err = prepare(tmp_path / "corpus", "--out", out, "--tokenizer", "bytes", *extra)
            assert code == 2 and err.count("\n") == 1 and "another preparation is writing" in err, err
            assert _tree(out) == files  # not even --overwrite touches it
    finally:
        os.close(fd)
    assert prepare(tmp_path / "corpus", "--out", out, "--tokenizer", "bytes")[0] == 0


# ---------------------------------------------------------------- a corpus as it comes (issue 27, item 7)


def _add_misfits(root: Path) -> dict[str, list[str]]:
    """What a real tree holds beside its text, as the standard library's and /usr/share/doc do: binary files
    (raw, behind a compression suffix, compressed without one) and text in Latin-1 or KOI8-R. Returns the skipped
    file names by reason."""
    import bz2
    import gzip
    import lzma

    import zstandard

    pdf = b"%PDF-1.5\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<< /Length 9 >>\nstream\n\x00\x01\x02 x\x9c\nendstream\n"
    binary = {
        "lib/libpython3.11.a": b"!<arch>\n/               0           0     0     0       " + bytes(range(256)),
        "doc/manual.pdf.gz": gzip.compress(pdf),
        "doc/data.bin.zst": zstandard.ZstdCompressor().compress(bytes(64) + b"text after zeros"),
        "doc/data.bin.bz2": bz2.compress(b"\x00" * 10),
        "doc/data.bin.xz": lzma.compress(b"\x7fELF\x02\x01\x01\x00"),
        "doc/changelog.txt": gzip.compress(b"compressed text without .gz in its name"),
    }
    latin = "# -*- coding: latin-1 -*-\nprint('caf\xe9 cr\xe8me br\xfbl\xe9e')\n"
    not_utf8 = {
        "lib/latin1.py": latin.encode("latin-1"),
        "lib/koi8r.py": "# -*- coding: koi8-r -*-\nprint('привет, мир')\n".encode("koi8-r"),
        # fine for 2,000 lines, then Latin-1: none of its documents may be read (a file is read whole or not)
        "lib/late.jsonl": _jsonl([f"fine {i}" for i in range(2000)]) + b'{"text": "caf\xe9"}\n',
    }
    for name, data in {**binary, **not_utf8}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return {"binary": sorted(binary), "not_utf8": sorted(not_utf8)}


def test_a_directory_is_prepared_as_it_comes(tmp_path: Path) -> None:
    import bz2
    import lzma

    docs = _build_corpus(tmp_path / "corpus")
    misfits = _add_misfits(tmp_path / "corpus")
    (tmp_path / "corpus" / "notes.txt.bz2").write_bytes(bz2.compress(b"read as text, bz2"))
    (tmp_path / "corpus" / "notes.txt.xz").write_bytes(lzma.compress(b"read as text, xz"))
    args = (tmp_path / "corpus", "--tokenizer", "bytes", "--val-fraction", 0, "--task-mb", 0.001)
    code, printed, err = prepare_printing(*args, "--out", tmp_path / "out", workers=2)
    assert code == 0, err
    manifest = mf.load_manifest(tmp_path / "out")
    skipped = {r: [str(Path(p).relative_to(tmp_path / "corpus")) for p in s.paths]
               for r, s in manifest.skipped.items()}
    assert skipped == misfits
    assert {r: s.files for r, s in manifest.skipped.items()} == {"binary": 6, "not_utf8": 3}
    read = set(_decode(tmp_path / "out", None)["train"])
    assert read == set(docs) | {"read as text, bz2", "read as text, xz"}  # nothing of a skipped file
    assert not {s.path for s in manifest.sources} & {p for s in manifest.skipped.values() for p in s.paths}
    assert manifest.selection == {
        "include": [], "exclude": [], "encoding_errors": {"named": "strict", "found": "skip"}
    }
    last = printed.strip().splitlines()[-1]
    assert last.startswith("skipped 9 files (") and "6 binary (e.g. " in last and "3 not UTF-8 (e.g. " in last
    assert "manifest.json" in last

    # replace: the text that is not UTF-8 is read, with U+FFFD; binary files are skipped all the same
    code, err = prepare(*args, "--out", tmp_path / "replaced", "--encoding-errors", "replace")
    assert code == 0, err
    replaced = mf.load_manifest(tmp_path / "replaced")
    assert list(replaced.skipped) == ["binary"]
    read = set(_decode(tmp_path / "replaced", None)["train"])
    assert latin_ok(read) and "caf\ufffd" in read and len(read) == len(docs) + 2 + 2 + 2000 + 1

    # strict: the first such file refuses the preparation, and nothing is left
    code, err = prepare(*args, "--out", tmp_path / "strict" / "out", "--encoding-errors", "strict")
    assert code == 2 and err.count("\n") == 1 and "is not UTF-8 text" in err and "lib/" in err, err
    assert not (tmp_path / "strict").exists()


def latin_ok(read: set[str]) -> bool:
    """The Latin-1 file's document, its accented letters replaced."""
    return any(d.startswith("# -*- coding: latin-1") and "caf\ufffd cr\ufffdme" in d for d in read)


def test_a_file_named_one_by_one_is_refused_when_binary_and_strict_when_not_utf8(tmp_path: Path) -> None:
    misfits = _add_misfits(tmp_path / "corpus")
    (tmp_path / "corpus" / "good.txt").write_text("good")
    out = tmp_path / "out"
    for name in misfits["binary"]:
        code, err = prepare(tmp_path / "corpus" / name, "--out", out, "--tokenizer", "bytes")
        assert code == 2 and err.count("\n") == 1 and f"{name} is binary (" in err, err
        assert not out.exists()
    code, err = prepare(tmp_path / "corpus" / "doc/changelog.txt", "--out", out, "--tokenizer", "bytes")
    assert "gz-compressed data without .gz in its name): add that suffix" in err, err
    for name in misfits["not_utf8"]:
        code, err = prepare(tmp_path / "corpus" / name, "--out", out, "--tokenizer", "bytes")
        assert code == 2 and err.count("\n") == 1 and f"{name} is not UTF-8 text" in err, err
        assert not out.exists()
    # asked for, a named file's encoding errors are skipped too
    named = [tmp_path / "corpus" / n for n in ("good.txt", *misfits["not_utf8"])]
    code, err = prepare(*named, "--out", out, "--tokenizer", "bytes", "--encoding-errors", "skip")
    assert code == 0, err
    assert mf.load_manifest(out).skipped["not_utf8"].files == 3
    assert _decode(out, None)["train"] == ["good"]


@pytest.mark.parametrize("compress", [False, True])
def test_one_document_per_line_a_file_is_skipped_whole(tmp_path: Path, compress: bool) -> None:
    """--text-per-line reads a file line by line: a line that is not UTF-8 far into it skips the whole file, the
    lines before it included (they would otherwise be in a shard already)."""
    import gzip

    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("kept one\nkept two\n")
    late = "".join(f"line {i}\n" for i in range(50000)).encode() + b"caf\xe9\n"
    name, data = ("b.txt.gz", gzip.compress(late)) if compress else ("b.txt", late)
    (tmp_path / "corpus" / name).write_bytes(data)
    out = tmp_path / "out"
    code, err = prepare(tmp_path / "corpus", "--text-per-line", "--out", out, "--tokenizer", "bytes",
                        "--val-fraction", 0)
    assert code == 0, err
    assert _decode(out, None)["train"] == ["kept one", "kept two"]
    assert mf.load_manifest(out).skipped == {"not_utf8": mf.SkippedFiles(1, len(data), (str(tmp_path / "corpus" / name),))}


def _chosen(corpus: Path, *specs: object, include: tuple[str, ...] = (), exclude: tuple[str, ...] = ()) -> set[str]:
    from launcher.prepare.filters import Filters
    from launcher.prepare.inputs import resolve_inputs

    files = resolve_inputs([str(s) for s in specs], None, Filters(include, exclude))
    return {Path(f.path).relative_to(corpus).as_posix() + ("" if f.named else "*") for f in files}


def test_include_and_exclude_choose_among_the_files_found(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    for name in ("a.py", "b.md", "sub/c.py", "sub/deep/d.py", "test/t.py", "docs/x.md", "docs/y.txt"):
        (corpus / name).parent.mkdir(parents=True, exist_ok=True)
        (corpus / name).write_text(name)
    found = {"a.py*", "b.md*", "sub/c.py*", "sub/deep/d.py*", "test/t.py*", "docs/x.md*", "docs/y.txt*"}
    assert _chosen(corpus, corpus) == found  # * : found, not named
    assert _chosen(corpus, corpus, include=("*.py",)) == {"a.py*", "sub/c.py*", "sub/deep/d.py*", "test/t.py*"}
    assert _chosen(corpus, corpus, include=("*.py",), exclude=("test/",)) == {"a.py*", "sub/c.py*", "sub/deep/d.py*"}
    assert _chosen(corpus, corpus, include=("sub/**/*.py",)) == {"sub/c.py*", "sub/deep/d.py*"}
    assert _chosen(corpus, corpus, include=("/*.py", "docs/*.md")) == {"a.py*", "docs/x.md*"}
    assert _chosen(corpus, corpus, exclude=("**/deep/**", "*.md", "docs")) == {"a.py*", "sub/c.py*", "test/t.py*"}
    # on the path under the input directory, whichever directory is given
    assert _chosen(corpus, corpus / "sub", include=("deep/*.py",)) == {"sub/deep/d.py*"}
    # under a glob's leading directory
    assert _chosen(corpus, str(corpus / "*"), exclude=("sub/deep/",)) == found - {"sub/deep/d.py*"}
    assert _chosen(corpus, str(corpus / "**" / "*.py"), exclude=("test/**",)) == {
        "a.py*", "sub/c.py*", "sub/deep/d.py*"
    }
    # a file named one by one is chosen whatever the filters say
    assert _chosen(corpus, corpus / "b.md", corpus, include=("*.py",)) == {
        "b.md", "a.py*", "sub/c.py*", "sub/deep/d.py*", "test/t.py*"
    }


@pytest.mark.parametrize(
    "args, words",
    [
        (["--include", "*.rs"], ["no input files chosen by --include '*.rs'", "'src/**'"]),
        (["--exclude", "*"], ["no input files chosen by --exclude '*'"]),
        (["--include", ""], ["--include '' matches nothing", "'*.py'"]),
        (["--exclude", "# not a glob"], ["--exclude '# not a glob' matches nothing", "\\#"]),
        (["--include", "\\"], ["--include '\\\\' is not a glob"]),
        (["NAMED", "--include", "*.txt"], ["--include '*.txt' choose among the files found", "leave the filters"]),
        (["--encoding-errors", "ignore"], ["--encoding-errors: invalid choice: 'ignore'", "strict"]),
    ],
)
def test_filters_that_choose_nothing_are_refused(tmp_path: Path, args: list[str], words: list[str]) -> None:
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("some text")
    inputs: list[object] = [tmp_path / "corpus"]
    if args[0] == "NAMED":  # the file named one by one, not its directory
        inputs, args = [tmp_path / "corpus" / "a.txt"], args[1:]
    code, err = prepare(*inputs, *args, "--out", tmp_path / "out", "--tokenizer", "bytes")
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert all(w in err for w in words), err
    assert not (tmp_path / "out").exists()


def test_other_filters_are_another_preparation(tmp_path: Path) -> None:
    _build_corpus(tmp_path / "corpus")
    _add_misfits(tmp_path / "corpus")
    out = tmp_path / "out"
    base = (tmp_path / "corpus", "--out", out, "--tokenizer", "bytes")
    code, err = prepare(*base, "--include", "*.txt", "--include", "*.jsonl")
    assert code == 0, err
    manifest, files = mf.load_manifest(out), _tree(out)
    # Recorded in canonical order (no negated pattern: the order can't matter, filters.canonical).
    assert manifest.selection["include"] == ["*.jsonl", "*.txt"] and manifest.selection["exclude"] == []
    assert {Path(s.path).name for s in manifest.sources} == {"a.txt", "c.txt", "d.jsonl"}
    assert {r: [Path(p).name for p in s.paths] for r, s in manifest.skipped.items()} == {
        "binary": ["changelog.txt"],  # gzip data named .txt
        "not_utf8": ["late.jsonl"],
    }
    for change, words in [
        (["--include", "*.txt"], "prepared with --include '*.jsonl' --include '*.txt'; this command has --include '*.txt'"),
        (["--include", "*.txt", "--include", "*.jsonl", "--exclude", "sub/"], "with no --exclude; this command has --exclude sub/"),
        (["--include", "*.txt", "--include", "*.jsonl", "--encoding-errors", "replace"], "with no --encoding-errors; this command has --encoding-errors replace"),
        ([], "prepared with --include '*.jsonl' --include '*.txt'; this command has no --include"),
    ]:
        code, err = prepare(*base, *change)
        assert code == 2 and err.count("\n") == 1 and "already holds a different preparation" in err, err
        assert words in err and "--overwrite" in err, err
        assert _tree(out) == files  # nothing overwritten
    code, printed, err = prepare_printing(*base, "--include", "*.txt", "--include", "*.jsonl")
    assert code == 0 and "already complete" in printed and _tree(out) == files, err
    code, err = prepare(*base, "--exclude", "lib/", "--overwrite")
    assert code == 0, err
    manifest = mf.load_manifest(out)
    assert manifest.selection["exclude"] == ["lib/"] and list(manifest.skipped) == ["binary"]


def test_the_same_filters_in_another_order_are_the_same_preparation_unless_one_is_negated(tmp_path: Path) -> None:
    """Issue 27's trial: --exclude '*.json' --exclude '*.json.gz' and the same two the other way round were refused
    as another preparation. As in .gitignore, order matters only with a negated pattern."""
    _build_corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    base = (tmp_path / "corpus", "--out", out, "--tokenizer", "bytes")
    assert prepare(*base, "--exclude", "*.json", "--exclude", "*.json.gz")[0] == 0
    files = _tree(out)
    code, printed, err = prepare_printing(*base, "--exclude", "*.json.gz", "--exclude", "*.json", "--exclude", "*.json")
    assert code == 0 and "already complete" in printed and _tree(out) == files, err
    # With a negation the order is the meaning: '*.txt' then '!a.txt' keeps a.txt, the other way round does not.
    out2 = tmp_path / "out2"
    negated = (tmp_path / "corpus", "--out", out2, "--tokenizer", "bytes")
    assert prepare(*negated, "--exclude", "*.txt", "--exclude", "!a.txt")[0] == 0
    code, err = prepare(*negated, "--exclude", "!a.txt", "--exclude", "*.txt")
    assert code == 2 and "already holds a different preparation" in err, err


@pytest.mark.parametrize("left", ["empty", "a half-written plan"])
def test_a_preparation_killed_before_its_plan_was_written_goes_on_with_the_same_command(
        tmp_path: Path, left: str) -> None:
    """kill -9 while listing the files left .parts/ without plan.json: the same command was then refused as "a
    preparation whose plan is gone"; nothing of value is there, so it starts over."""
    _build_corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    (out / ".parts").mkdir(parents=True)
    if left != "empty":
        (out / ".parts" / "plan.json.tmp-123").write_text('{"out": ')
    code, err = prepare(tmp_path / "corpus", "--out", out, "--tokenizer", "bytes", "--include", "*.txt")
    assert code == 0, err
    assert mf.load_manifest(out).selection["include"] == ["*.txt"]
    # A task's completion record without a plan is something kept: that is still refused, not deleted.
    other = tmp_path / "other"
    (other / ".parts").mkdir(parents=True)
    (other / ".parts" / "00000.json").write_text("{}")
    code, err = prepare(tmp_path / "corpus", "--out", other, "--tokenizer", "bytes")
    assert code == 2 and "a preparation whose plan is gone" in err and (other / ".parts" / "00000.json").exists()


def test_a_plan_from_before_the_filters_is_another_preparation(tmp_path: Path) -> None:
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("some text")
    out = tmp_path / "out"
    assert prepare(tmp_path / "corpus", "--out", out, "--tokenizer", "bytes")[0] == 0
    plan = json.loads((out / ".parts/plan.json").read_text())
    del plan["version"]  # what launcher.prepare wrote before --include/--exclude/--encoding-errors
    for key in ("include", "exclude", "encoding_errors"):
        del plan["options"][key]
    for file in plan["inputs"]:
        del file["named"]
    (out / ".parts/plan.json").write_text(json.dumps(plan))
    files = _tree(out)
    code, err = prepare(tmp_path / "corpus", "--out", out, "--tokenizer", "bytes")
    assert code == 2 and "prepared by an earlier launcher.prepare (plan version 1, now 2)" in err, err
    assert _tree(out) == files


def test_skipped_paths_are_listed_up_to_a_bound_and_counted_in_full() -> None:
    info = mf.TokenizerInfo("bytes", None, 257, "bytes")
    skipped = [(f"/c/{i:04d}.bin", 10, "binary") for i in range(mf.SKIPPED_LISTED + 50)] + [("/c/x.py", 3, "not_utf8")]
    manifest = mf.build_manifest(info, 256, 0.0, 0, {}, [], {"include": ["*"]}, skipped)
    assert manifest.skipped["binary"] == mf.SkippedFiles(
        mf.SKIPPED_LISTED + 50, 10 * (mf.SKIPPED_LISTED + 50), tuple(p for p, _, _ in skipped[: mf.SKIPPED_LISTED])
    )
    assert manifest.skipped["not_utf8"] == mf.SkippedFiles(1, 3, ("/c/x.py",))
    assert json.loads(json.dumps(manifest.to_json()))["skipped"]["not_utf8"] == {
        "files": 1, "bytes": 3, "paths": ["/c/x.py"]
    }


def _children(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _ended(process) -> bool:
    import psutil

    try:
        return process.status() == psutil.STATUS_ZOMBIE  # dead, waiting for whoever adopted it to reap it
    except psutil.NoSuchProcess:
        return True


def test_worker_processes_end_when_the_preparing_process_is_killed(tmp_path: Path) -> None:
    """kill -9 (or the OOM killer) of a preparation leaves no worker behind: they end with their parent."""
    import subprocess
    import sys

    from tests.slurm.helpers import poll

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(16):
        (corpus / f"{i:02d}.txt").write_text(_doc(i) * 2000)
    driver = subprocess.Popen(
        [sys.executable, "-m", "launcher.prepare", str(corpus), "--out", str(tmp_path / "out"), "--tokenizer",
         "bytes", "--task-mb", "0.01", "--workers", "3"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    children: list = []
    try:

        def workers() -> list:
            spawned = [p for p in _children(driver.pid) if "spawn_main" in " ".join(p.cmdline())]
            return spawned if len(spawned) == 2 else []

        spawned = poll(workers, timeout=60, what="the preparation's 2 worker processes", interval=0.01)
        for worker in spawned:  # held where they are: the preparation cannot finish before its kill
            worker.suspend()
        children = _children(driver.pid)  # the workers and multiprocessing's resource tracker
        assert driver.poll() is None
        driver.kill()
        driver.wait()
        for worker in spawned:  # a worker stopped before it armed the parent-death signal sees its parent gone
            if not _ended(worker):
                worker.resume()
        poll(lambda: all(_ended(p) for p in children), timeout=30, what="the orphaned workers to end",
             interval=0.05)
    finally:  # whatever happened above, leave no process of this test behind
        driver.kill()
        driver.wait()
        for process in children:
            if not _ended(process):
                process.kill()
    # a worker whose parent is gone before it can arm the signal ends at once
    code = "from launcher.prepare.run import _end_with; _end_with(-1); print('lived on')"
    late = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (late.returncode, late.stdout) == (1, ""), late.stderr


def _tree_with_misfit_json(root: Path) -> None:
    """A documentation tree as /usr/share/doc holds them: text, a JSON Lines file, and .json / .json.gz files
    that are JSON documents, not JSON Lines (pretty-printed; one object without the text field)."""
    import gzip

    (root / "pkg" / "api").mkdir(parents=True)
    (root / "README").write_text("read me first")
    (root / "pkg" / "notes.jsonl").write_text('{"text": "a note"}\n{"text": "another"}\n')
    (root / "pkg" / "api" / "fs.json.gz").write_bytes(gzip.compress(b'{\n  "source": "fs.md"\n}\n'))
    (root / "pkg" / "api" / "vm.json.gz").write_bytes(gzip.compress(b'[\n  1, 2\n]\n'))
    (root / "pkg" / "synopsis.json").write_text('{"type": "module", "source": "synopsis.md"}\n')


def test_a_tree_skips_files_not_in_their_extensions_format_and_strict_names_every_pattern(tmp_path: Path) -> None:
    """Issue 36, item 2: a file found in a directory whose first record can't be read in its extension's format is
    skipped and reported (as binary files are); --strict stops, naming every --exclude the tree needs; a file named
    on the command line still stops with its line number."""
    _tree_with_misfit_json(tmp_path / "doc")
    code, out, err = prepare_printing(tmp_path / "doc", "--out", tmp_path / "ds", "--tokenizer", "bytes")
    assert code == 0, err
    manifest = mf.load_manifest(tmp_path / "ds")
    assert {r: s.files for r, s in manifest.skipped.items()} == {"not_jsonl": 3}
    assert sorted(Path(s.path).name for s in manifest.sources) == ["README", "notes.jsonl"]
    assert manifest.split("train").documents + manifest.split("val").documents == 3
    assert "skipped 3 files (" in out and "3 not JSON Lines (e.g. " in out, out

    code, err = prepare(tmp_path / "doc", "--out", tmp_path / "strict", "--tokenizer", "bytes", "--strict")
    assert code == 2 and err.count("\n") == 1, err
    assert "3 files found are not JSON Lines" in err and "--exclude '*.json.gz' --exclude '*.json'" in err, err
    assert not (tmp_path / "strict").exists()

    named = tmp_path / "doc" / "pkg" / "synopsis.json"
    code, err = prepare(named, "--out", tmp_path / "named", "--tokenizer", "bytes")
    assert code == 2 and f"{named} line 1 has no field 'text'" in err, err


def test_a_tree_skips_compressed_files_it_cannot_read_to_their_end(tmp_path: Path) -> None:
    """Issue 36, item 2 (found again on a second trial): a `.gz` found in a directory that is plain text, or one cut
    short (a truncated download, readable for its first blocks), is skipped whole and reported, not a stop; --strict
    stops, naming each file's --exclude in one line; a file named on the command line still stops."""
    import gzip

    root = tmp_path / "tree"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("hello world\n" * 50)
    (root / "plain.txt.gz").write_text("not gzip at all\n")
    whole = gzip.compress(b"a line of text long enough to span the first block\n" * 4000)
    (root / "sub" / "cut.md.gz").write_bytes(whole[: len(whole) // 2])
    (root / "sub" / "good.txt.gz").write_bytes(gzip.compress(b"kept\n" * 30))
    for per_line in ([], ["--text-per-line"]):
        out = tmp_path / f"ds{len(per_line)}"
        code, printed, err = prepare_printing(root, "--out", out, "--tokenizer", "bytes", *per_line)
        assert code == 0, err
        manifest = mf.load_manifest(out)
        assert {r: s.files for r, s in manifest.skipped.items()} == {"damaged": 2}, per_line
        assert sorted(Path(s.path).name for s in manifest.sources) == ["a.txt", "good.txt.gz"], per_line
        assert "2 unreadable compressed data (e.g. " in printed, printed
        text = b"".join(np.fromfile(p, dtype=np.uint16).astype(np.uint8).tobytes()
                        for p in sorted((out / "train").glob("*.bin")))
        assert b"a line of text" not in text and b"kept" in text

    code, err = prepare(root, "--out", tmp_path / "strict", "--tokenizer", "bytes", "--strict")
    assert code == 2 and err.count("\n") == 1, err
    assert "2 compressed files found can't be read" in err, err
    assert "--exclude plain.txt.gz" in err and "--exclude cut.md.gz" in err, err
    assert not (tmp_path / "strict").exists()

    code, err = prepare(root / "sub" / "cut.md.gz", "--out", tmp_path / "named", "--tokenizer", "bytes")
    assert code == 2 and "cut.md.gz" in err and "cannot read" in err, err
