"""Checks of what the user points at, before any worker starts: the run root, the token data (a token file: existence,
access, format, size, and its token ids against the vocabulary; a prepared dataset: its manifest's vocabulary; a
glob of files or a mixture's sources: each of them), that data.document_mask has the documents it masks by
(contract/rules/document_mask.py), and tracker credentials when logging online.

Everything here is cheap: a token file is read whole only up to SCAN_BYTES; beyond that, SAMPLE_WINDOWS evenly
spaced windows are read (a bad id elsewhere still ends in a one-line error on the ranks).
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from urllib.parse import urlparse

from omegaconf import DictConfig

from contract.data.source_checks import check_source
from contract.errors import ConfigError
from contract.rules.document_mask import check_document_mask
from contract.rules.document_mask import enabled as document_mask_enabled
from contract.rules.log_backends import backends
from launcher.checks.overrides import as_typed


def check_run_root(cfg: DictConfig) -> None:
    root = Path(str(cfg.run.root)).expanduser()
    if root.exists() and not root.is_dir():
        raise ConfigError(f"run.root={cfg.run.root} is a file, not a directory: point run.root at a directory")
    existing = next(p for p in (root.absolute(), *root.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(f"run.root={cfg.run.root} lies inside a file ({existing}): point run.root at a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"run.root={cfg.run.root} can't be written ({existing} is not writable for you): point "
                          "run.root at a directory you can write")


def check_token_data(cfg: DictConfig) -> None:
    """data=tokens: what data.path (or each of data.sources) points at can be trained on by this model; either
    typed without data=tokens is refused."""
    from contract.data.spec import sft_layout, token_sources

    d = cfg.data
    layout = sft_layout(d)
    padded = (f"data.sft_layout={layout} lays out supervised fine-tuning records (launcher.prepare --prompt-field/"
              "--response-field or --messages-field), and {what} has none: drop data.sft_layout")
    if d.get("_target_") or d.name != "tokens":
        if not d.get("_target_") and d.get("path"):  # else the run trains on the synthetic stream and says nothing
            raise ConfigError(f"data.path={d.path} is token data on disk, which data={d.name} does not read: add "
                              "data=tokens")
        if not d.get("_target_") and d.get("sources"):
            raise ConfigError(f"data.sources mixes token data on disk, which data={d.name} does not read: add "
                              "data=tokens")
        if layout != "packed":
            raise ConfigError(padded.format(what=f"data.{'_target_' if d.get('_target_') else 'name'}="
                                                 f"{d.get('_target_') or d.name}"))
        return
    for spec in token_sources(d):
        check_source(spec, int(d.seq_len), int(cfg.model.vocab_size))
        if layout != "packed" and not spec.is_sft:
            raise ConfigError(padded.format(what=f"{spec.key}={spec.path}"))
        if spec.is_sft and cfg.trainer.get("max_tokens") is not None:
            raise ConfigError(f"{as_typed('trainer.max_tokens', cfg.trainer.max_tokens)} counts tokens, and {spec.key}={spec.path} "
                              "is supervised fine-tuning data whose steps train a varying number of response tokens: "
                              "give trainer.max_steps or trainer.max_epochs")


def _netrc_has(host: str) -> bool:
    try:
        # An explicit path: Python's default-path security check refuses a 0644 file wandb itself accepts.
        path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def check_credentials(cfg: DictConfig) -> None:
    """logger.mode=online must be able to log in on the ranks; the key itself is never read into a file."""
    lg = cfg.logger
    offline = os.environ.get("WANDB_MODE") in ("offline", "disabled")
    if "wandb" not in backends(lg.backend) or lg.mode != "online" or offline:
        return
    key = os.environ.get("WANDB_API_KEY")
    if key is not None:
        if not key.strip() or any(c.isspace() for c in key):
            raise ConfigError("WANDB_API_KEY is empty or holds whitespace: export the key exactly as shown at "
                              "wandb.ai/authorize, or use logger.mode=offline")
        return
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    if not _netrc_has(host):
        raise ConfigError(f"logger.mode=online needs wandb credentials and none were found (no WANDB_API_KEY, no "
                          f"{host} entry in ~/.netrc): run `wandb login`, or use logger.mode=offline")


def check_inputs(cfg: DictConfig) -> None:
    check_run_root(cfg)
    check_token_data(cfg)
    if document_mask_enabled(cfg):
        from launcher.plan.world import ranks_on_gpus

        check_document_mask(cfg, ranks_on_gpus(cfg))
    check_credentials(cfg)
