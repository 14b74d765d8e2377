"""The tokenizer a run trained with, found from its config: a prepared dataset's manifest names it (`bytes`, or a
tokenizer.json by path and sha256). A mixture's sources share one (checked at launch). The synthetic stream, flat
token files and a user's dataset name none. No torch: the launcher encodes prompts and decodes samples with it, and
the ranks encode lm-evaluation-harness requests with it (train/evaluation/harness_lm.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.data.manifest import is_prepared_dir, load_manifest
from contract.errors import ConfigError

BYTES = "bytes"  # the manifest's name of the byte tokenizer (launcher/prepare/tokenizer.py writes it)


@dataclass(frozen=True)
class RunTokenizer:
    name: str  # "bytes" or the tokenizer.json's path
    eod_id: int
    path: str | None  # tokenizer.json; None for bytes

    def encode(self, text: str) -> list[int]:
        """Ids as the preparation encodes a document: no special tokens added around it."""
        if self.path is None:
            return list(text.encode("utf-8"))
        return list(self._hf().encode(text, add_special_tokens=False).ids)

    def unknown_characters(self, text: str) -> list[str]:
        """The characters of `text` no token of the vocabulary stands for (encoded alone they give no token, or the
        unknown token), whitespace aside: a BPE without byte fallback trained on other text has none for 'é' or
        '☃', and leaves them out of the ids. The bytes tokenizer has every one."""
        if self.path is None:
            return []
        tokenizer = self._hf()
        unk = getattr(tokenizer.model, "unk_token", None)
        unk_id = tokenizer.token_to_id(unk) if unk else None
        unknown = []
        for char in dict.fromkeys(c for c in text if not c.isspace()):
            ids = tokenizer.encode(char, add_special_tokens=False).ids
            if not ids or (unk_id is not None and unk_id in ids):
                unknown.append(char)
        return unknown

    def decode(self, ids: list[int]) -> str:
        if self.path is None:  # ids past 255 (the end of a document, or a larger model vocabulary) are no bytes
            return b"".join(bytes([i]) if 0 <= i < 256 else "\ufffd".encode() for i in ids).decode(
                "utf-8", errors="replace")
        return str(self._hf().decode(ids, skip_special_tokens=False))

    def _hf(self) -> Any:
        from tokenizers import Tokenizer

        assert self.path is not None
        return Tokenizer.from_file(self.path)


def _prepared_paths(data_cfg: Any) -> list[tuple[str, str]]:
    """(key, path) of each token source of a data=tokens config, data.path or data.sources.NAME.path."""
    if data_cfg.get("_target_") or data_cfg.get("name") != "tokens":
        return []
    if data_cfg.get("path"):
        return [("data.path", str(data_cfg.path))]
    return [(f"data.sources.{name}.path", str(src.path)) for name, src in (data_cfg.get("sources") or {}).items()
            if src.get("path")]


def describe_data(data_cfg: Any) -> str:
    if data_cfg.get("_target_"):
        return f"a dataset of its own (data._target_={data_cfg._target_})"
    paths = _prepared_paths(data_cfg)
    if not paths:
        return f"data={data_cfg.get('name')}"
    return ", ".join(f"{key}={path}" for key, path in paths)


def run_tokenizer(data_cfg: Any) -> tuple[RunTokenizer | None, str]:
    """The run's tokenizer, or None and why there is none (a phrase: "it trained on the synthetic stream")."""
    for key, path in _prepared_paths(data_cfg):
        if not is_prepared_dir(path):
            if Path(path).expanduser().exists():
                continue  # a flat token file or a glob: no tokenizer recorded
            # Relative: a config.yaml written before paths were made absolute at launch (launcher/plan/paths.py).
            relative = "" if Path(path).expanduser().is_absolute() else \
                " (a relative path: run this from the directory the run was launched in)"
            return None, f"its prepared dataset {key}={path} is not there any more{relative}, so its tokenizer is unknown"
        try:
            manifest = load_manifest(path, check_files=False)
        except ConfigError as err:
            return None, f"its prepared dataset's manifest can't be read ({err})"
        tokenizer, eod_id = manifest.tokenizer, manifest.eod_id
        if tokenizer.name == BYTES and tokenizer.path is None:
            return RunTokenizer(BYTES, eod_id, None), ""
        assert tokenizer.path is not None
        file = Path(tokenizer.path)
        if not file.is_file():
            return None, f"the tokenizer it was prepared with, {file}, is not there any more"
        if "sha256:" + hashlib.sha256(file.read_bytes()).hexdigest() != tokenizer.fingerprint:
            return None, f"the tokenizer it was prepared with, {file}, has changed since"
        return RunTokenizer(str(file), eod_id, str(file)), ""
    return None, f"it trained on {describe_data(data_cfg)}, which names no tokenizer"
