"""Launch checks of named validation sets (eval.sets.NAME.*, contract/rules/eval_sets.py check_eval): the same token
checks as data.path, seeds by type and range, keys a kind does not read, and wording that names the fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from contract.errors import ConfigError
from launcher.compose import compose_and_plan
from tests.prepared_data import random_shards, write_prepared

BASE = ["run.root=/tmp/x", "eval.every=5"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("evalsets")
    good = root / "good.bin"
    (np.arange(1000) % 256).astype(np.uint16).tofile(good)
    big = root / "big.bin"
    np.arange(1000).astype(np.uint16).tofile(big)  # ids up to 999, the tiny model's vocabulary is 256
    text = root / "notes.txt"
    text.write_text("plain words, not token ids\n" * 200)
    write_prepared(root / "wide", random_shards(1, [500]), val=random_shards(2, [500]), vocab=257)
    write_prepared(root / "noval", random_shards(3, [500]), vocab=256, eod_id=255)
    write_prepared(root / "withval", random_shards(4, [500]), val=random_shards(5, [500]), vocab=256, eod_id=255)
    return {"good": good, "big": big, "text": text, "wide": root / "wide", "noval": root / "noval",
            "withval": root / "withval"}


def _refusal(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as err:
        compose_and_plan([*BASE, *overrides])
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(("kind", "file", "expected"), [
    ("tokens", "big", "holds token id 999, outside the vocabulary of model.vocab_size=256"),
    ("tokens", "text", "looks like UTF-8 text, not token ids"),
    ("val", "wide", "was prepared with a vocabulary of 257 ids (tokenizer bytes) but model.vocab_size=256"),
    ("tokens", "wide", "was prepared with a vocabulary of 257 ids (tokenizer bytes) but model.vocab_size=256"),
])
def test_an_eval_sets_token_ids_get_the_checks_of_data_path(data: dict[str, Path], kind: str, file: str,
                                                             expected: str) -> None:
    message = _refusal([f"eval.sets.x.kind={kind}", f"eval.sets.x.path={data[file]}"])
    assert message.startswith(f"eval.sets.x.path={data[file]} ")
    assert expected in message


def test_sets_that_fit_the_model_are_accepted(data: dict[str, Path]) -> None:
    cfg, _ = compose_and_plan([*BASE, "eval.sets.a.kind=tokens", f"eval.sets.a.path={data['good']}",
                               "eval.sets.b.kind=val", f"eval.sets.b.path={data['withval']}",
                               "eval.sets.c.kind=synthetic", f"eval.sets.c.seed={2**32 - 1}"])
    assert set(cfg.eval.sets) == {"a", "b", "c"}


@pytest.mark.parametrize("seed", ["abc", "-3", "4294967296", "1.5", "true"])
def test_a_seed_outside_0_to_2_32_minus_1_is_refused(seed: str) -> None:
    message = _refusal(["eval.sets.x.kind=synthetic", f"eval.sets.x.seed={seed}"])
    assert message.startswith("eval.sets.x.seed=")
    assert "0..4294967295" in message


def test_a_set_without_a_kind_says_the_kind_is_missing() -> None:
    message = _refusal(["eval.sets.x.seed=3"])
    assert "None" not in message
    assert "eval.sets.x has no kind: set eval.sets.x.kind=" in message


def test_a_prepared_directory_without_a_validation_split_says_so(data: dict[str, Path]) -> None:
    message = _refusal(["eval.sets.x.kind=val", f"eval.sets.x.path={data['noval']}"])
    assert "was prepared without a validation split" in message
    assert "--val-fraction" in message and "eval.sets.x.kind=tokens" in message
    message = _refusal(["data=tokens", f"data.path={data['noval']}"])
    assert f"needs a validation set and data.path={data['noval']} was prepared without a validation split" in message
    assert "--val-fraction" in message


def test_a_manifest_path_points_at_its_directory(data: dict[str, Path]) -> None:
    manifest = data["withval"] / "manifest.json"
    for kind in ("val", "tokens"):
        message = _refusal([f"eval.sets.x.kind={kind}", f"eval.sets.x.path={manifest}"])
        assert f"point eval.sets.x.path at its directory: eval.sets.x.path={data['withval']}" in message


@pytest.mark.parametrize(("overrides", "key", "reads"), [
    (["eval.sets.x.kind=synthetic", "eval.sets.x.path=/tmp"], "eval.sets.x.path", "seed"),
    (["eval.sets.x.kind=synthetic", "eval.sets.x._target_=my.Dataset"], "eval.sets.x._target_", "seed"),
    (["eval.sets.x.kind=tokens", "eval.sets.x.path=/tmp/t.bin", "eval.sets.x.seed=3"], "eval.sets.x.seed", "path"),
    (["eval.sets.x.kind=val", "eval.sets.x.path=/tmp/d", "+eval.sets.x.args.n=1"], "eval.sets.x.args", "path"),
    (["eval.sets.x._target_=my.Dataset", "eval.sets.x.seed=1"], "eval.sets.x.seed", "_target_, args"),
])
def test_keys_a_kind_does_not_read_are_refused(overrides: list[str], key: str, reads: str) -> None:
    message = _refusal(overrides)
    assert message.startswith(f"{key} is not read by eval.sets.x.kind=")
    assert f"reads only {reads}" in message
