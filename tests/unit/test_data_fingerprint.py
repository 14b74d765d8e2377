"""The data fingerprint saved with every checkpoint (contract/data/fingerprint.py): it changes with what a run would
read (a file's contents, size or dtype, a prepared dataset's shards, a mixture's sources and weights), and a resume
on other data is refused, on the ranks as at launch, unless data.allow_changed=true."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from contract.data.fingerprint import BLOCK_BYTES, data_fingerprint, describe_change, refuse_changed_data
from contract.errors import ConfigError
from tests.prepared_data import random_shards, write_prepared


def _cfg(**data: object) -> object:
    base = {"name": "tokens", "path": None, "dtype": "uint16", "seq_len": 16, "seed": 5, "shuffle": True,
            "sources": {}, "_target_": None, "allow_changed": False}
    return OmegaConf.create({**base, **data})


def _print(path: Path, dtype: str = "uint16") -> str:
    return data_fingerprint(_cfg(path=str(path), dtype=dtype))["data.path"]["fingerprint"]  # type: ignore[index]


def test_a_token_file_by_size_dtype_and_sampled_contents(tmp_path: Path) -> None:
    path = tmp_path / "tokens.bin"
    ids = np.random.default_rng(0).integers(0, 1000, 4 * BLOCK_BYTES).astype(np.uint16)
    ids.tofile(path)
    first = _print(path)
    assert first.startswith("sha256:") and _print(path) == first
    assert _print(path, "int16") != first
    changed = ids.copy()
    changed[0] += 1  # the first block is always sampled, so is the last
    changed.tofile(path)
    assert _print(path) != first
    changed = ids.copy()
    changed[-1] += 1
    changed.tofile(path)
    assert _print(path) != first
    np.concatenate([ids, [7]]).astype(np.uint16).tofile(path)
    assert _print(path) != first
    ids.tofile(path)
    assert _print(path) == first


def test_a_glob_and_a_prepared_dataset(tmp_path: Path) -> None:
    for i in range(3):
        np.arange(i, 100 + i, dtype=np.uint16).tofile(tmp_path / f"part{i}.bin")
    glob = _print(tmp_path / "part*.bin")
    (tmp_path / "part1.bin").rename(tmp_path / "part9.bin")  # the same files in another order
    assert _print(tmp_path / "part*.bin") != glob
    manifest = write_prepared(tmp_path / "prep", random_shards(0, [100, 50]))
    assert _print(tmp_path / "prep") == manifest.fingerprint
    assert data_fingerprint(OmegaConf.create({"name": "synthetic", "_target_": None})) is None


def test_a_mixture_by_source_and_weight(tmp_path: Path) -> None:
    write_prepared(tmp_path / "a", random_shards(1, [200]))
    write_prepared(tmp_path / "b", random_shards(2, [200]))
    sources = {"web": {"path": str(tmp_path / "a"), "weight": 3}, "code": {"path": str(tmp_path / "b"), "weight": 1}}
    saved = data_fingerprint(_cfg(sources=sources))
    assert saved is not None and set(saved) == {"data.sources.web", "data.sources.code"}
    assert saved["data.sources.web"]["weight"] == 0.75
    same = data_fingerprint(_cfg(sources={"code": {"path": str(tmp_path / "b"), "weight": 2},
                                          "web": {"path": str(tmp_path / "a"), "weight": 6}}))
    assert describe_change(saved, same) is None  # the same mixture typed otherwise
    reweighted = data_fingerprint(_cfg(sources={**sources, "code": {"path": str(tmp_path / "b"), "weight": 3}}))
    assert describe_change(saved, reweighted) == ("data.sources.code weight 0.25 -> 0.5; "
                                                  "data.sources.web weight 0.75 -> 0.5")
    swapped = data_fingerprint(_cfg(sources={**sources, "web": {"path": str(tmp_path / "b"), "weight": 3}}))
    assert (describe_change(saved, swapped) or "").startswith("data.sources.web: ")
    one = data_fingerprint(_cfg(path=str(tmp_path / "a")))
    assert describe_change(saved, one) == "data.path added; data.sources.code gone; data.sources.web gone"


def test_a_resume_on_other_data_is_refused_unless_allowed(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.bin"
    np.arange(5000, dtype=np.uint16).tofile(tokens)
    checkpoint = tmp_path / "run" / "checkpoints" / "step_8"
    checkpoint.mkdir(parents=True)
    marker = {"step": 8, "world_size": 1, "data": data_fingerprint(_cfg(path=str(tokens)))}
    (checkpoint / "COMPLETE").write_text(json.dumps(marker))
    refuse_changed_data(_cfg(path=str(tokens)), checkpoint, 8)  # the same data: resumes
    np.arange(1, 5001, dtype=np.uint16).tofile(tokens)  # rewritten in place, same size
    with pytest.raises(ConfigError, match=r"run's checkpoint at step 8 was trained on other data \(data.path: "
                                          r"[0-9a-f]{12} -> [0-9a-f]{12}\): .*add data.allow_changed=true"):
        refuse_changed_data(_cfg(path=str(tokens)), checkpoint, 8, on_ranks=True)
    refuse_changed_data(_cfg(path=str(tokens), allow_changed=True), checkpoint, 8)
    (checkpoint / "COMPLETE").write_text(json.dumps({"step": 8, "world_size": 1}))  # before fingerprints: resumes
    refuse_changed_data(_cfg(path=str(tokens)), checkpoint, 8)


def test_allow_changed_lets_the_data_keys_change_at_launch(tmp_path: Path) -> None:
    from launcher.checks.resume_checks import check_run_dir
    from launcher.compose import compose_and_plan
    from launcher.run.rundir import config_yaml

    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    np.arange(3000, dtype=np.uint16).tofile(a)
    np.arange(1, 3001, dtype=np.uint16).tofile(b)
    common = ["data=tokens", "model.vocab_size=4096", "run.name=r", f"run.root={tmp_path}"]
    saved, _ = compose_and_plan([*common, f"data.path={a}"])
    run_dir = tmp_path / "r"
    checkpoint = run_dir / "checkpoints" / "step_3"
    checkpoint.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(config_yaml(OmegaConf.to_container(saved, resolve=True)))
    (checkpoint / "COMPLETE").write_text(json.dumps({"step": 3, "world_size": 1,
                                                      "data": data_fingerprint(saved.data)}))
    check_run_dir(saved, run_dir, 1)
    other, _ = compose_and_plan([*common, f"data.path={b}"])
    with pytest.raises(ConfigError, match="other training settings \\(data.path: .*to resume it on this data add "
                                          "data.allow_changed=true"):
        check_run_dir(other, run_dir, 1)
    allowed, _ = compose_and_plan([*common, f"data.path={b}", "data.allow_changed=true"])
    check_run_dir(allowed, run_dir, 1)
    (run_dir / "config.yaml").unlink()  # a checkpoint copied into a run directory of its own
    with pytest.raises(ConfigError, match="was trained on other data \\(data.path: "):
        check_run_dir(other, run_dir, 1)
