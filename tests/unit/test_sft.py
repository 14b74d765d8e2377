"""Supervised fine-tuning data (issue 31, item 4): launcher.prepare writes a loss mask beside the tokens (prompt/
response records, raw or through the tokenizer's chat template, and chats), the ranks' targets leave everything but
the responses out of the loss (packed and padded), a prompt's change leaves the targets as they were, and bad input
is one `error:` line, exit 2, nothing written. Training and sampling with --chat: tests/dist/test_sft.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from contract.data.manifest import load_manifest
from contract.data.sft import RECORD_START, RESPONSE
from contract.errors import ConfigError
from launcher.compose import compose_and_plan
from launcher.prepare.__main__ import main as prepare_main
from tests.sft_data import shift_records, words, write_records, write_tokenizer
from train.data.batches import IGNORE_INDEX, load_micro_batch
from train.data.sources import build_source
from train.loss import cross_entropy


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tok") / "chat tok")


def prepare(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = prepare_main([*argv, "--val-fraction", "0"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


def records_of(directory: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """(ids, mask) of each record of a prepared dataset's train split, cut at the RECORD_START bits."""
    manifest = load_manifest(directory)
    ids = np.concatenate([np.fromfile(f, dtype=manifest.np_dtype) for f in manifest.shard_files("train")])
    mask = np.concatenate([np.fromfile(f, dtype=np.uint8) for f in manifest.mask_files("train") or []])
    starts = list(np.flatnonzero(mask & RECORD_START)) + [len(ids)]
    return [(ids[a:b], mask[a:b]) for a, b in zip(starts, starts[1:], strict=False)]


def decode(tok: Path, ids: np.ndarray) -> str:
    from tokenizers import Tokenizer

    return str(Tokenizer.from_file(str(tok / "tokenizer.json")).decode(ids.tolist(), skip_special_tokens=False))


def test_prompt_response_records_keep_only_the_response_in_the_mask(tmp_path: Path, tok: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    shift_records(tmp_path / "pairs.jsonl", 20)
    out = prepare(capsys, str(tmp_path / "pairs.jsonl"), "--out", str(tmp_path / "ds"), "--tokenizer", str(tok),
                  "--prompt-field", "prompt", "--response-field", "response")
    assert "rendered with the tokenizer's chat template" in out and "response tokens" in out
    manifest = load_manifest(tmp_path / "ds")
    assert manifest.sft is not None and manifest.sft["rendering"] == "chat_template"
    records = records_of(tmp_path / "ds")
    assert len(records) == manifest.split("train").documents == 20
    first = json.loads((tmp_path / "pairs.jsonl").read_text().splitlines()[0])
    ids, mask = records[0]
    # the response, the template's end of turn and the end-of-document id count; the rendered prompt does not
    assert decode(tok, ids[(mask & RESPONSE) > 0]) == first["response"] + "<|end|><|end|>"
    assert decode(tok, ids[(mask & RESPONSE) == 0]) == f"<|user|>{first['prompt']}\n<|assistant|>"
    assert manifest.split("train").response_tokens == sum(int(((m & RESPONSE) > 0).sum()) for _, m in records)


def test_raw_records_without_a_template_and_chats_with_several_turns(tmp_path: Path, tok: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    write_records(tmp_path / "pairs.jsonl", [{"q": "Say hi: ", "a": "hi!"}])
    prepare(capsys, str(tmp_path / "pairs.jsonl"), "--out", str(tmp_path / "raw"), "--tokenizer", "bytes",
            "--prompt-field", "q", "--response-field", "a")
    assert load_manifest(tmp_path / "raw").sft["rendering"] == "raw"  # type: ignore[index]
    [(ids, mask)] = records_of(tmp_path / "raw")
    assert ids.tolist() == list(b"Say hi: hi!") + [256]
    assert ((mask & RESPONSE) > 0).tolist() == [False] * 8 + [True] * 4
    chat = [{"role": "user", "content": "shift: ab"}, {"role": "assistant", "content": "bc"},
            {"role": "user", "content": "shift: ca"}, {"role": "assistant", "content": "db"}]
    write_records(tmp_path / "chats.jsonl", [{"messages": chat}])
    prepare(capsys, str(tmp_path / "chats.jsonl"), "--out", str(tmp_path / "chat"), "--tokenizer", str(tok),
            "--messages-field", "messages")
    [(ids, mask)] = records_of(tmp_path / "chat")
    assert decode(tok, ids[(mask & RESPONSE) > 0]) == "bc<|end|>db<|end|><|end|>"
    assert decode(tok, ids[(mask & RESPONSE) == 0]) == "<|user|>shift: ab\n<|assistant|><|user|>shift: ca\n<|assistant|>"


def data_cfg(path: Path, layout: str, seq_len: int = 16) -> object:
    return OmegaConf.create({"name": "tokens", "path": str(path), "dtype": "uint16", "seq_len": seq_len, "seed": 3,
                             "shuffle": True, "sources": {}, "sft_layout": layout})


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_a_prompt_change_leaves_the_loss_targets_unchanged(tmp_path: Path, tok: Path, layout: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Two datasets whose prompts differ (same length, other tokens) and whose responses are the same: their
    inputs differ, their targets (ids and IGNORE_INDEX mask) are equal; the loss reads no prompt position."""
    chosen = words(40, seed=1)
    for name, prefix in (("a", "shift: "), ("b", "prompt ")):
        write_records(tmp_path / f"{name}.jsonl", [{"p": prefix + w, "r": w[::-1]} for w in chosen])
        prepare(capsys, str(tmp_path / f"{name}.jsonl"), "--out", str(tmp_path / name), "--tokenizer", str(tok),
                "--prompt-field", "p", "--response-field", "r")
    (inputs_a, targets_a), (inputs_b, targets_b) = (
        load_micro_batch(build_source(data_cfg(tmp_path / name, layout), 20), list(range(8))) for name in "ab")
    assert not torch.equal(inputs_a, inputs_b)
    assert torch.equal(targets_a, targets_b)
    counted = targets_a != IGNORE_INDEX
    assert 0 < int(counted.sum()) < counted.numel()
    # the loss is a function of the response positions' logits only
    logits = torch.randn(*targets_a.shape, 20)
    scrambled = torch.where(counted[..., None], logits, torch.randn_like(logits) * 10)
    flat = targets_a.reshape(-1)
    assert torch.equal(cross_entropy(logits.reshape(-1, 20), flat), cross_entropy(scrambled.reshape(-1, 20), flat))


def test_padded_samples_are_one_record_each_and_a_sample_without_responses_has_loss_zero(
        tmp_path: Path, tok: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shift_records(tmp_path / "pairs.jsonl", 12)
    prepare(capsys, str(tmp_path / "pairs.jsonl"), "--out", str(tmp_path / "ds"), "--tokenizer", str(tok),
            "--prompt-field", "prompt", "--response-field", "response")
    source = build_source(data_cfg(tmp_path / "ds", "padded", seq_len=24), 20)  # a record is 18 tokens
    assert source.windows == 12  # type: ignore[attr-defined]
    inputs, targets = load_micro_batch(source, list(range(12)))
    assert (inputs[:, 0] == 1).all()  # every sample starts at its record's <|user|>
    assert ((targets != IGNORE_INDEX).sum(dim=1) == 5).all()  # 3 letters, <|end|>, the end-of-document id
    assert (inputs[:, 17:] == 0).all() and (targets[:, 17:] == IGNORE_INDEX).all()  # padding, never a target
    # cut before its response (seq_len 8 < the prompt): nothing counts, and the loss is 0, not NaN
    _, short = load_micro_batch(build_source(data_cfg(tmp_path / "ds", "padded", seq_len=8), 20), [0, 1])
    assert (short == IGNORE_INDEX).all()
    logits = torch.randn(16, 20, requires_grad=True)
    loss = cross_entropy(logits, short.reshape(-1))
    loss.backward()
    assert loss.item() == 0.0 and logits.grad is not None and not logits.grad.any()


PR = ["--prompt-field", "prompt", "--response-field", "response"]
GOOD_PAIR = {"prompt": "a", "response": "b"}
GOOD_CHAT = {"m": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
# A good record first: a bad one is found before anything is written, however far into the file.
BAD_RECORDS = [
    ([GOOD_PAIR, {"prompt": "x"}], PR, "line 2 has no field 'response' (it has 'prompt')"),
    ([GOOD_PAIR, {"prompt": "x", "response": "  "}], PR, "line 2 field 'response' (the response) is empty"),
    ([GOOD_PAIR, {"prompt": "x", "response": 3}], PR, "line 2 field 'response' is int, not text"),
    ([GOOD_PAIR, ["x", "y"]], PR, "line 2 is a JSON list, not an object"),
    ([GOOD_CHAT, {"m": [{"role": "user", "content": "hi"}]}], ["--messages-field", "m"],
     "line 2 'm' has no assistant turn"),
    ([GOOD_CHAT, {"m": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]}],
     ["--messages-field", "m"], "line 2 message 1 of 'm' (an assistant turn) is empty"),
    ([GOOD_CHAT, {"m": "hi"}], ["--messages-field", "m"], "line 2 field 'm' is not a list of messages"),
    ([GOOD_PAIR], ["--prompt-field", "prompt"], "prompt/response records need both fields: add --response-field"),
    ([GOOD_PAIR], [*PR, "--messages-field", "m"],
     "--messages-field and --prompt-field/--response-field are two record formats: give one"),
]


def refused(capsys: pytest.CaptureFixture[str], out: Path, *argv: str) -> str:
    code = prepare_main([*argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert not out.exists()  # nothing written
    return err


@pytest.mark.parametrize("records, flags, words_", BAD_RECORDS)
def test_bad_records_are_one_line_and_nothing_is_written(tmp_path: Path, tok: Path, records: list, flags: list,
                                                         words_: str, capsys: pytest.CaptureFixture[str]) -> None:
    write_records(tmp_path / "in.jsonl", records)
    assert words_ in refused(capsys, tmp_path / "out", str(tmp_path / "in.jsonl"), "--tokenizer", str(tok), *flags)


def test_chats_need_a_chat_template_and_records_json_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_records(tmp_path / "in.jsonl", [{"m": [{"role": "assistant", "content": "b"}]}])
    err = refused(capsys, tmp_path / "out", str(tmp_path / "in.jsonl"), "--tokenizer", "bytes", "--messages-field", "m")
    assert "bytes has none (no chat_template" in err
    plain = write_tokenizer(tmp_path / "plain tok", template=None)
    err = refused(capsys, tmp_path / "out", str(tmp_path / "in.jsonl"), "--tokenizer", str(plain), "--messages-field",
                  "m")
    assert "has none (no chat_template" in err
    (tmp_path / "in.txt").write_text("text")
    err = refused(capsys, tmp_path / "out", str(tmp_path / "in.txt"), "--tokenizer", "bytes", "--prompt-field", "p",
                  "--response-field", "r")
    assert "is not JSON Lines" in err


def test_launch_refuses_what_sft_data_can_not_honour(tmp_path: Path, tok: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    shift_records(tmp_path / "pairs.jsonl", 40)
    prepare(capsys, str(tmp_path / "pairs.jsonl"), "--out", str(tmp_path / "sft"), "--tokenizer", str(tok),
            "--prompt-field", "prompt", "--response-field", "response")
    (tmp_path / "plain.bin").write_bytes(np.arange(200, dtype=np.uint16).tobytes())
    base = [f"run.root={tmp_path / 'runs'}", "logger.backend=none", "model=tiny", "data=tokens", "data.seq_len=16"]
    cases = [
        ([f"data.sources.a.path={tmp_path / 'sft'}", f"data.sources.b.path={tmp_path / 'plain.bin'}"],
         "a mixture of it is not supported yet: train on it alone with data.path"),
        ([f"data.path={tmp_path / 'sft'}", "trainer.max_tokens=1000"], "give trainer.max_steps or trainer.max_epochs"),
        ([f"data.path={tmp_path / 'sft'}", "trainer.max_tokens=1000"], "^trainer.max_tokens=1000 counts tokens"),
        ([f"data.path={tmp_path / 'plain.bin'}", "data.sft_layout=padded"],
         "data.sft_layout=padded lays out supervised fine-tuning records"),
        ([f"data.path={tmp_path / 'sft'}", "data.sft_layout=stacked"], "data.sft_layout=stacked is not a layout"),
    ]
    for overrides, words_ in cases:
        with pytest.raises(ConfigError, match=words_.replace(".", r"\.")):
            compose_and_plan([*base, *overrides])
    cfg, plan = compose_and_plan([*base, f"data.path={tmp_path / 'sft'}", "data.sft_layout=padded",
                                  "trainer.max_steps=5"])
    line = next(line for line in plan.data_lines if line.startswith("supervised fine-tuning data"))
    assert "only response tokens count, in the loss and in `tokens`" in line and "one of its 40 records" in line

    # Padded, a record longer than a sample is cut: a cut before every response token trained on nothing and
    # finished with loss 0 ('0 response tokens'); a cut through the responses is said with the share it keeps.
    from contract.data.sft import padded_cut

    [mask] = sorted((tmp_path / "sft" / "train").glob("*.mask"))
    cut = padded_cut([mask], 16)
    prompt = min(int(np.flatnonzero(r & 1)[0]) for r in np.split(np.fromfile(mask, np.uint8),
                                                                   np.flatnonzero(np.fromfile(mask, np.uint8) & 2)[1:]))
    with pytest.raises(ConfigError, match=rf"cuts each record .* to data.seq_len \+ 1 = {prompt} tokens, before its "
                                          rf"first response token: nothing would train: data.seq_len={cut.longest - 1}"):
        compose_and_plan([*base[:-1], f"data.seq_len={prompt - 1}", f"data.path={tmp_path / 'sft'}",
                          "data.sft_layout=padded", "trainer.max_steps=5"])
    _, plan = compose_and_plan([*base[:-1], f"data.seq_len={cut.longest - 2}", f"data.path={tmp_path / 'sft'}",
                                "data.sft_layout=padded", "trainer.max_steps=5"])
    line = next(line for line in plan.data_lines if line.startswith("supervised fine-tuning data"))
    assert "the cut leaves" in line and f"data.seq_len={cut.longest - 1} keeps every record whole" in line, line


def test_the_same_command_is_complete_and_another_template_is_another_preparation(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tok = write_tokenizer(tmp_path / "tok")
    shift_records(tmp_path / "pairs.jsonl", 10)
    argv = [str(tmp_path / "pairs.jsonl"), "--out", str(tmp_path / "ds"), "--tokenizer", str(tok), "--prompt-field",
            "prompt", "--response-field", "response"]
    prepare(capsys, *argv)
    assert "already complete" in prepare(capsys, *argv)
    manifest = (tmp_path / "ds" / "manifest.json").read_bytes()
    config = json.loads((tok / "tokenizer_config.json").read_text())
    config["chat_template"] = config["chat_template"].replace("<|user|>", "<|user|> ")
    (tok / "tokenizer_config.json").write_text(json.dumps(config))
    assert prepare_main([*argv, "--val-fraction", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the tokenizer's chat template (its tokenizer_config.json) has changed" in err, err
    assert (tmp_path / "ds" / "manifest.json").read_bytes() == manifest  # nothing overwritten


def test_document_masking_of_packed_chats_takes_records_not_end_of_turn_ids(
        tmp_path: Path, tok: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """data.document_mask with SFT data: a chat is one document, though its template ends each turn with the same
    <|end|> the preparation puts after each record (end-of-document ids would cut it at every turn); padded records
    are one document each."""
    chat = [{"role": "user", "content": "shift: ab"}, {"role": "assistant", "content": "bc"},
            {"role": "user", "content": "shift: ca"}, {"role": "assistant", "content": "db"}]
    write_records(tmp_path / "chats.jsonl", [{"messages": chat}] * 12)
    prepare(capsys, str(tmp_path / "chats.jsonl"), "--out", str(tmp_path / "chat"), "--tokenizer", str(tok),
            "--messages-field", "messages")
    ids, mask = (np.concatenate([r[k] for r in records_of(tmp_path / "chat")]) for k in (0, 1))
    record = np.cumsum((mask & RECORD_START) > 0)  # each token's record, over the whole stream
    seq_len = 16
    cfg = data_cfg(tmp_path / "chat", "packed", seq_len)
    cfg.shuffle = False  # type: ignore[attr-defined]
    source = build_source(cfg, 20)
    _, _, documents = load_micro_batch(source, list(range(6)), documents=True)
    for row, window in enumerate(source.window_of(list(range(6))).tolist()):
        expected = record[window * seq_len: window * seq_len + seq_len]
        assert np.diff(documents[row].numpy()).tolist() == np.diff(expected).tolist()
    eod = int(load_manifest(tmp_path / "chat").eod_id)
    assert (ids == eod).sum() == 3 * 12  # two ends of turn and the end of document in each chat
    padded = build_source(data_cfg(tmp_path / "chat", "padded", seq_len), 20)
    _, _, documents = load_micro_batch(padded, [0, 1], documents=True)
    assert documents.unique().tolist() == [0]


def test_a_chat_template_jinja_file_is_the_template_as_save_pretrained_writes_it(
        tmp_path: Path, tok: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """transformers' save_pretrained writes the template to chat_template.jinja, not into tokenizer_config.json:
    prepared from such a directory, the records are rendered as from the key (not as raw prompt + response)."""
    from tests.sft_data import TEMPLATE

    own = write_tokenizer(tmp_path / "saved tok", template=None)
    (own / "chat_template.jinja").write_text(TEMPLATE)
    write_records(tmp_path / "pairs.jsonl", [{"p": "shift: ab", "r": "bc"}, {"p": "shift: ca", "r": "db"}])
    for name, tokenizer in (("key", tok), ("file", own)):
        prepare(capsys, str(tmp_path / "pairs.jsonl"), "--out", str(tmp_path / name), "--tokenizer", str(tokenizer),
                "--prompt-field", "p", "--response-field", "r")
    assert load_manifest(tmp_path / "file").sft["rendering"] == "chat_template"  # type: ignore[index]
    for (ids_key, mask_key), (ids_file, mask_file) in zip(records_of(tmp_path / "key"), records_of(tmp_path / "file"),
                                                          strict=True):
        assert ids_key.tolist() == ids_file.tolist() and mask_key.tolist() == mask_file.tolist()
