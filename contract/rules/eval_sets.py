"""The validation sets a config names (eval.sets.NAME), resolved and checked; torch-free.

A set is a dict with a `kind`:
    val        the validation split of a prepared directory: `path` (default data.path; with a mixture, each
               prepared source's split is its own set when no set is named)
    tokens     a token file, a prepared directory's train split or a shard glob: `path`, read in order
    synthetic  held-out samples of the synthetic stream (data=synthetic's table, sample indices from
               HELD_OUT_START on, which training never reaches); `seed` (default data.seed)
    dataset    a user's map-style dataset: `_target_` and `args`, items in order
With eval.every > 0 (or eval.at_start=true alone: step 0 only, a check of imported weights) and no set named, one
set "val": the prepared data's validation split, else the synthetic stream's held-out samples, else the launch is
refused.
"""

from __future__ import annotations

from typing import Any

from contract.errors import ConfigError
from contract.rules.eval_jobs import jobs_enabled

KINDS = ("val", "tokens", "synthetic", "dataset")
KEYS = ("kind", "path", "seed", "_target_", "args")
# The keys each kind reads besides `kind`: any other is refused, not silently ignored.
KIND_KEYS = {"val": ("path",), "tokens": ("path",), "synthetic": ("seed",), "dataset": ("_target_", "args")}
NO_VAL_SPLIT = "was prepared without a validation split (--val-fraction 0)"
# Sample indices of the synthetic stream a validation set reads: training would need 2^62 samples to reach them.
HELD_OUT_START = 2**62
EXAMPLE = "eval.sets.NAME.kind=tokens eval.sets.NAME.path=FILE"


def eval_section(cfg: Any) -> Any:
    """cfg.eval, or None for a config written before the key existed."""
    return cfg.get("eval") if hasattr(cfg, "get") else getattr(cfg, "eval", None)


def enabled(cfg: Any) -> bool:
    section = eval_section(cfg)
    return section is not None and int(section.every) > 0


def start_only(cfg: Any) -> bool:
    """eval.at_start=true alone: validate the initial weights at step 0 and never again (eval.every=0, no jobs)."""
    section = eval_section(cfg)
    return (section is not None and bool(section.get("at_start")) and not enabled(cfg)
            and not jobs_enabled(cfg))


def validates(cfg: Any) -> bool:
    """Whether the run validates at all: every eval.every steps, in evaluation jobs, or at step 0 alone."""
    return enabled(cfg) or jobs_enabled(cfg) or start_only(cfg)


def asked(cfg: Any) -> str:
    """What asked for validation, as typed: eval.every=N, or eval.async_jobs=true (evaluation jobs)."""
    return f"eval.every={cfg.eval.every}" if enabled(cfg) else "eval.async_jobs=true"


def _plain(node: Any) -> dict[str, Any]:
    from omegaconf import DictConfig, OmegaConf

    return dict(OmegaConf.to_container(node, resolve=True)) if isinstance(node, DictConfig) else dict(node or {})  # type: ignore[arg-type]


def default_sets(cfg: Any, on_ranks: bool = False) -> dict[str, dict[str, Any]]:
    data = cfg.data
    if data.get("_target_"):
        raise ConfigError(f"{asked(cfg)} needs a validation set and data._target_ has none: name one, "
                          f"e.g. eval.sets.val.kind=dataset eval.sets.val._target_=YOUR_VALIDATION_DATASET")
    if data.name == "synthetic":
        return {"val": {"kind": "synthetic", "seed": int(data.seed)}}
    if data.name == "tokens":
        from contract.data.spec import token_sources

        specs = token_sources(data, split="val", on_ranks=on_ranks)
        found = {s.name or "val": {"kind": "val", "path": s.path} for s in specs
                 if s.manifest is not None and s.windows(int(data.seq_len)) >= 1}
        if found:
            return found
        bare = next((s for s in specs if s.manifest is not None and s.tokens == 0), None)
        if bare is not None:
            raise ConfigError(f"{asked(cfg)} needs a validation set and {bare.key}={bare.path} {NO_VAL_SPLIT}: "
                              f"prepare it again with --val-fraction F (e.g. 0.01), or name a set, e.g. {EXAMPLE}")
    raise ConfigError(f"{asked(cfg)} needs a validation set and data={data.name} has no validation "
                      f"split (only a prepared directory has one): name one, e.g. {EXAMPLE}")


def resolved_sets(cfg: Any, on_ranks: bool = False) -> dict[str, dict[str, Any]]:
    """name -> the set's plain dict, kind filled in; raises ConfigError (one line) for a set that can't work."""
    named = _plain(eval_section(cfg).sets)
    if not named:
        return default_sets(cfg, on_ranks)
    out = {}
    for name, entry in named.items():
        key = f"eval.sets.{name}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{key}={entry!r} must be a set with a kind ({', '.join(KINDS)}), e.g. {EXAMPLE}")
        unknown = sorted(set(entry) - set(KEYS))
        if unknown:
            raise ConfigError(f"{key}.{unknown[0]} is not a key of a validation set: use {', '.join(KEYS)}")
        kind = entry.get("kind") or ("dataset" if entry.get("_target_") else None)
        if kind is None:
            raise ConfigError(f"{key} has no kind: set {key}.kind=KIND ({', '.join(KINDS)}), e.g. {EXAMPLE}")
        if kind not in KINDS:
            raise ConfigError(f"{key}.kind={kind} must be one of {', '.join(KINDS)}: e.g. {EXAMPLE}")
        _check_keys(key, kind, entry)
        entry = {**entry, "kind": kind}
        if kind == "val":
            entry["path"] = entry.get("path") or (cfg.data.get("path") if cfg.data.name == "tokens" else None)
            if not entry["path"]:
                raise ConfigError(f"{key}.kind=val needs a prepared directory: add {key}.path=DIR (data.path is "
                                  "used when data=tokens has one)")
        if kind == "tokens" and not entry.get("path"):
            raise ConfigError(f"{key}.kind=tokens needs {key}.path=FILE (a token file, prepared directory or glob)")
        if kind == "dataset" and not entry.get("_target_"):
            raise ConfigError(f"{key}.kind=dataset needs {key}._target_=YOUR_DATASET (and {key}.args.*)")
        if kind == "synthetic":
            entry["seed"] = _seed(key, entry["seed"]) if entry.get("seed") is not None else int(cfg.data.seed)
        out[str(name)] = entry
    return out


def _check_keys(key: str, kind: str, entry: dict[str, Any]) -> None:
    reads = KIND_KEYS[kind]
    for k in KEYS:
        if k != "kind" and k not in reads and entry.get(k) is not None:
            raise ConfigError(f"{key}.{k} is not read by {key}.kind={kind}, which reads only {', '.join(reads)}: "
                              f"drop {key}.{k} (or pick the kind that reads it)")


def _seed(key: str, raw: Any) -> int:
    from contract.config.schema import SEED_MAX

    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= SEED_MAX:
        raise ConfigError(f"{key}.seed={raw} is not a seed: give {key}.seed an integer in 0..{SEED_MAX}")
    return raw


def check_eval(cfg: Any) -> None:
    """Launch-time refusals: validation with a pipeline, sets that don't resolve or have nothing to read, harness
    tasks that can't be scored (contract/rules/harness.py)."""
    from contract.rules.harness import check_harness

    check_harness(cfg)
    if not validates(cfg):
        section = eval_section(cfg)
        if section is not None and section.get("sets"):
            name = next(iter(section.sets))
            raise ConfigError(f"eval.sets.{name} is never evaluated: validation is off (eval.every=0); set eval.every=N "
                              "(or eval.async_jobs=true on a cluster), or drop the eval.sets keys")
        return
    pp = int(cfg.parallel.pp)
    if pp > 1 and jobs_enabled(cfg):  # in-loop validation runs the pipeline's own schedule forward only
        raise ConfigError(f"{asked(cfg)} with parallel.pp={pp}: evaluation jobs have no pipeline layout yet; set "
                          "eval.async_jobs=false and eval.every=N (in-loop validation) or train with parallel.pp=1")
    check_sets(cfg)


def check_sets(cfg: Any) -> None:
    """Every val or tokens set names what it can read (launcher.evaluate checks them so too)."""
    for name, entry in resolved_sets(cfg).items():
        if entry["kind"] in ("val", "tokens"):
            _check_tokens(cfg, name, entry)


def set_spec(cfg: Any, name: str, entry: dict[str, Any]) -> Any:
    """What a val or tokens set's path names (contract/data/spec.py SourceSpec): a val set's validation split, a
    tokens set's file, glob or train split; its windows(data.seq_len) are the set's samples."""
    from contract.data.spec import resolve, sft_layout

    split = "val" if entry["kind"] == "val" else "train"
    return resolve(str(entry["path"]), f"eval.sets.{name}.path", str(cfg.data.dtype), split=split,
                   layout=sft_layout(cfg.data))


def _check_tokens(cfg: Any, name: str, entry: dict[str, Any]) -> None:
    """A val or tokens set: what its path names, with the checks data.path gets (launcher/checks/input_checks.py)."""
    from contract.data.source_checks import check_source

    key, seq_len = f"eval.sets.{name}", int(cfg.data.seq_len)
    spec = set_spec(cfg, name, entry)
    if entry["kind"] == "val":
        if spec.manifest is None:
            raise ConfigError(f"{key}.path={entry['path']} is not a prepared directory, so it has no validation "
                              f"split: use {key}.kind=tokens to evaluate on the whole file")
        if spec.tokens == 0:
            raise ConfigError(f"{key}.path={entry['path']} {NO_VAL_SPLIT}: prepare it again with --val-fraction F "
                              f"(e.g. 0.01), or use {key}.kind=tokens to evaluate on its train split")
        if spec.windows(seq_len) < 1:
            raise ConfigError(f"{key}.path={entry['path']} holds {spec.tokens} validation tokens, fewer than one "
                              f"sample (data.seq_len + 1 = {seq_len + 1}): lower data.seq_len or prepare it with a "
                              "larger --val-fraction")
    check_source(spec, seq_len, int(cfg.model.vocab_size))


def repeat_warning(name: str, samples: int, batches: int, global_batch: int) -> str | None:
    """The words for a set smaller than one pass (None when it is not): a pass reads global sample indices
    [0, batches x global_batch) round-robin, so some samples are read twice and weigh double in the loss. Said by
    the ranks at the first pass, and by the launch plan (launcher/plan/launch_plan.py eval_set_warnings)."""
    per_pass = batches * global_batch
    if samples >= per_pass:
        return None
    fits = samples // global_batch
    fix = (f"set eval.batches={fits} ({fits * global_batch} samples) or give the set at least {per_pass} samples"
           if fits >= 1 else f"give the set at least {global_batch} samples (one batch) and {per_pass} for "
           f"eval.batches={batches}")
    return (f"validation set {name} holds {samples} samples and a pass reads {per_pass} (eval.batches={batches} x "
            f"the global batch {global_batch}): it reads some samples more than once, and they weigh more in its "
            f"loss; {fix}")


def plan_line(cfg: Any, global_batch: int) -> str | None:
    """The launch plan's words for validation: when, how much, on which sets (None: no validation)."""
    if not validates(cfg):
        return None
    section = eval_section(cfg)
    if start_only(cfg):
        when = "at step 0 only (eval.at_start=true; eval.every=0, so nothing validates later)"
    else:
        when = (f"an evaluation job per checkpoint (every trainer.ckpt_every={int(cfg.trainer.ckpt_every)} steps and "
                "the last)" if jobs_enabled(cfg) else f"every {int(section.every)} steps and at the end")
        if section.get("at_start"):
            when += ", and at step 0"
    samples = int(section.batches) * global_batch
    what = {"val": "the validation split of {path}", "tokens": "{path}", "synthetic": "the synthetic stream's "
            "held-out samples (seed {seed})", "dataset": "{_target_}"}
    sets = "; ".join(f"{name}: {what[e['kind']].format(**{'path': '', 'seed': '', '_target_': '', **e})}"
                     for name, e in resolved_sets(cfg).items())
    return (f"validation: {when}, {int(section.batches)} batches of {global_batch} samples "
            f"({samples * int(cfg.data.seq_len):,} tokens) per set; {sets}")
