"""The launch plan's data lines: what the run reads of each source (in epochs), supervised fine-tuning data's
response tokens and layout, and the validation sets smaller than a pass."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from contract.errors import ConfigError
from contract.rules.document_mask import attention_line
from contract.rules.eval_sets import repeat_warning, resolved_sets, set_spec, validates
from launcher.plan.run_length import length_key
from launcher.plan.world import ranks_on_gpus


def data_lines(cfg: DictConfig, samples: int) -> tuple[str, ...]:
    """data=tokens: what the run's `samples` samples read of each source, in epochs, and a warning for each
    source the run will read more than once, unless trainer.max_epochs asked for that (contract/data/spec.py,
    mixture.py: the arithmetic the ranks use)."""
    d = cfg.data
    if d.get("_target_") or d.name != "tokens":
        return ()
    from contract.data.mixture import samples_per_source
    from contract.data.spec import token_sources

    specs, seq_len = token_sources(d), int(d.seq_len)
    counts = samples_per_source([s.weight for s in specs], samples) if d.get("sources") else [samples]
    parts, warnings = [], []
    counted = (cfg.trainer.get("epochs_of") or "") if cfg.trainer.get("max_epochs") is not None else None
    for spec, count in zip(specs, counts, strict=True):
        windows = spec.windows(seq_len)
        epochs = count / windows
        what = (f"{spec.name} {spec.weight:.3g} = {count:,}" if spec.name else
                f"{spec.key}={spec.path} ({spec.kind}): {count:,}")
        parts.append(f"{what} of its {windows:,} ({epochs:.3g} epochs)")
        if epochs > 1 and spec.name != counted:
            warnings.append(f"warning: {spec.key.removesuffix('.path')} repeats: the run reads its {windows:,} samples "
                            f"{epochs:.3g} times over; add data or lower {length_key(cfg)}")
    head = f"data: {samples:,} samples of {seq_len + 1} tokens over the run: "
    attention = [attention_line(cfg, ranks_on_gpus(cfg))] if d.get("document_mask") else []
    return (head + "; ".join(parts), *[sft_line(s, seq_len) for s in specs if s.is_sft], *attention, *warnings)


def sft_line(spec: Any, seq_len: int) -> str:
    """Supervised fine-tuning data: what counts, and how its records make samples (data.sft_layout). Padded, a
    record longer than a sample is cut: what that leaves of the response tokens is said, and a cut that leaves
    none is refused (the run would train on nothing, and finish with a loss of 0)."""
    split = spec.manifest.split("train")
    share = f"{split.response_tokens:,} of its {split.tokens:,} tokens, {split.response_tokens / max(split.tokens, 1):.0%}"
    if spec.layout == "packed":
        layout = "packed: records one after another in windows"
    else:
        from contract.data.sft import padded_cut

        cut = padded_cut(spec.mask_files, seq_len)
        whole = f"data.seq_len={cut.longest - 1} keeps every record whole (the longest is {cut.longest:,} tokens)"
        if cut.response_tokens and not cut.kept:
            raise ConfigError(f"data.sft_layout=padded cuts each record of {spec.key}={spec.path} to data.seq_len + 1 = "
                              f"{seq_len + 1} tokens, before its first response token: nothing would train: "
                              f"{whole}, or use data.sft_layout=packed")
        layout = f"padded: one of its {spec.records:,} records a sample, a longer one cut"
        if cut.kept < cut.response_tokens:
            layout += (f"; the cut leaves {cut.share:.0%} of the response tokens ({cut.kept:,} of "
                       f"{cut.response_tokens:,}): {whole}")
    return (f"supervised fine-tuning data ({spec.key}): only response tokens count, in the loss and in `tokens` "
            f"({share}); data.sft_layout={layout}")


def eval_set_warnings(cfg: DictConfig, global_batch: int) -> tuple[str, ...]:
    """A warning for each val or tokens set with fewer samples than a validation pass reads (eval.batches x the
    global batch): the words the ranks say at the first pass (contract/rules/eval_sets.py repeat_warning). A small set
    is legal, so this is no refusal; synthetic sets are unbounded and a dataset's size is known only once built."""
    if not validates(cfg):
        return ()
    batches, seq_len, out = int(cfg.eval.batches), int(cfg.data.seq_len), []
    for name, entry in resolved_sets(cfg).items():
        if entry["kind"] in ("val", "tokens"):
            words = repeat_warning(name, set_spec(cfg, name, entry).windows(seq_len), batches, global_batch)
            if words:
                out.append(f"warning: {words}")
    return tuple(out)
