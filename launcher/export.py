"""python -m launcher.export RUN_DIR [--step N | --best] --format safetensors|hf [--out PATH]

Consolidates a run's checkpoint (the newest complete one, --step N, or --best: the one that measured best by the
run's checkpoint.keep_best, else its first validation set's loss), written by any number of ranks with any
strategy, into full weights on this machine's CPU: one safetensors file, or a Hugging Face directory (--format hf:
slurmtrain's Llama- and GPT-2-style transformer as LlamaForCausalLM or GPT2LMHeadModel, a mixture of experts
(model.moe: a Llama with experts in every layer) as MixtralForCausalLM, a model=hf_causal_lm run as its own class) with config.json, generation_config.json, safetensors shards (--max-shard-size), the run's tokenizer,
in --dtype, loaded back and compared with the run's model before it is called done (--no-verify: only for a model
whose check does not fit in memory). Writes to RUN_DIR/export/ unless --out says where; never overwrites.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from contract.errors import EXIT_BAD_INPUT, ConfigError
from contract.rules.hf_export import refuse_unexportable
from contract.rundir import ckpt_layout as layout
from contract.rundir.hf_export import EXPORT_DIR, export_path
from launcher import compute_seam
from launcher.commands import CommandParser

CHECKPOINTS = layout.checkpoints_root(Path()).name


def run_and_step(path: Path, step: int | None) -> tuple[Path, int | None]:
    """A run directory and the step asked for, from what the user named: RUN_DIR (with --step), RUN/checkpoints or
    RUN/checkpoints/step_N (the forms model.init_from takes too)."""
    if path.name == CHECKPOINTS and path.is_dir():
        return path.parent, step
    named = layout.STEP_DIR.match(path.name)
    if named is None or path.parent.name != CHECKPOINTS or not path.is_dir():
        return path, step
    if step is not None and step != int(named.group(1)):
        raise ConfigError(f"{path} is the checkpoint of step {named.group(1)}, and --step {step} asks for another: "
                          "drop --step, or pass the run directory with --step")
    return path.parent.parent, int(named.group(1))


def pick_checkpoint(run_dir: Path, step: int | None, best: bool = False,
                    notes: list[str] | None = None) -> layout.CheckpointDir:
    """The checkpoint a command reads: the newest complete one, the one of `step`, or with `best` the one that
    measured best (launcher/observe/ranking.py; a line says which and by what: on stderr, or added to `notes` for
    the command to print once its other checks pass, so that a refusal stays one line). ConfigError (one line
    naming the fix) when there is none such."""
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir} is not a directory: pass a run directory (RUN_ROOT/RUN_NAME)")
    refuse_sweep_dir(run_dir)
    if best:
        if step is not None:
            raise ConfigError(f"--best and the checkpoint of step {step} both choose one: drop one of them (pass the "
                              "run directory with --best)")
        from launcher.observe.ranking import best_of_run, describe_best

        best_found, why = best_of_run(run_dir)
        if notes is None:
            print(describe_best(best_found, why), file=sys.stderr)
        else:
            notes.append(describe_best(best_found, why))
        return best_found.checkpoint
    if step is None:
        latest = layout.latest_complete_checkpoint(run_dir)
        if latest is None:
            raise ConfigError(f"{run_dir} has no complete checkpoint: train it first (or pass the run directory)")
        return latest
    chosen = layout.CheckpointDir(step, layout.step_dir(run_dir, step))
    if not chosen.complete:
        have = [c.step for c in layout.list_checkpoints(run_dir) if c.complete]
        raise ConfigError(f"{run_dir} has no complete checkpoint at step {step}: pick one of {have or 'none'}")
    return chosen


def refuse_sweep_dir(path: Path) -> None:
    """A sweep or search directory holds runs, not checkpoints: refuse it naming the run directories to pass (a
    search's best trial so far)."""
    import shlex

    from contract.search import layout as search_layout
    from launcher.sweeps.sweepdir import is_sweep_dir

    status = f"`python -m launcher.status {shlex.quote(str(path))}` lists them"
    if search_layout.is_search_dir(path):
        from launcher.sweeps.search_status import collect

        try:
            best = collect(path).best
        except Exception:  # noqa: BLE001 - a study we can't read (an RDB out of reach): the refusal still stands
            best, which = None, "its study can't be read here"
        else:
            which = "none is complete yet"
        if best is not None and best.run_dir:
            which = f"the best so far is trial {best.number}: {best.run_dir}"
        raise ConfigError(f"{path} is a search directory, not a run: pass one of its trials' run directories "
                          f"({which}; {status})")
    if is_sweep_dir(path):
        raise ConfigError(f"{path} is a sweep directory, not a run: pass one of its points' run directories "
                          f"({status})")


def output_path(run_dir: Path, step: int, fmt: str, out: str | None) -> Path:
    path = Path(out).expanduser() if out else (
        export_path(run_dir, step) if fmt == "hf" else run_dir / EXPORT_DIR / f"step_{step}.safetensors")
    if path.exists():
        raise ConfigError(f"{path} exists: pass --out NEW_PATH, or remove it first (nothing is overwritten)")
    check_writable(path.resolve())
    return path.resolve()


WRITABLE_FIX = "pass --out PATH in a directory you can write (with room for the weights)"


def check_writable(path: Path) -> None:
    """Refuse a path that can't be written before the checkpoint is read."""
    from launcher.checks.paths import unwritable

    why = unwritable(path.parent)
    if why is not None:
        raise ConfigError(f"cannot write {path} ({why}): {WRITABLE_FIX}")


def _is_write_error(err: Exception) -> bool:
    # safetensors reports I/O failures as its own SafetensorError ("I/O error: ..."); Hugging Face as OSError.
    return isinstance(err, OSError) or (type(err).__name__ == "SafetensorError" and "I/O error" in str(err))


def write_or_clean_up(path: Path, write: Callable[[], None]) -> None:
    """Run `write`; if writing fails (disk full, a directory turned read-only), remove everything it created under
    the nearest existing parent of `path` (temporary files included) and refuse in one line."""
    top = path
    while not top.parent.exists():
        top = top.parent
    before = set(top.parent.iterdir())
    try:
        write()
    except Exception as err:
        if not _is_write_error(err):
            raise
        for entry in set(top.parent.iterdir()) - before:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink(missing_ok=True)
        reason = " ".join(str(err).split())[:200]
        raise ConfigError(f"cannot write {path} ({reason}): {WRITABLE_FIX}") from None


def check_format(cfg: DictConfig, fmt: str) -> None:
    if fmt == "hf":
        refuse_unexportable(cfg.model, "--format hf", "--format safetensors exports it as it is")


@dataclass(frozen=True)
class HFOptions:
    """--format hf's own options (the dtype applies to both formats)."""
    dtype: str = "float32"
    max_shard_size: int | None = None  # bytes; None: save_pretrained's default
    verify: bool = True


class ExportMismatch(Exception):
    """The written directory did not reproduce the run's model (a bug to report, not the user's input)."""


SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]i?)?B?$", re.IGNORECASE)
UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}


def shard_size(text: str) -> int:
    """--max-shard-size in bytes: a number of bytes, or with a unit as save_pretrained reads them (5GB is 5e9
    bytes, 2GiB 2 * 2**30)."""
    found = SIZE.match(text.strip())
    size = int(float(found.group(1)) * UNITS[(found.group(2) or "").upper()]) if found else 0
    if size < 1:
        raise ConfigError(f"--max-shard-size {text!r} is not a size: give bytes or a number with a unit (5GB, "
                          "500MB, 2GiB)")
    return size


def export(run_dir: Path, step: int | None, fmt: str, out: str | None, best: bool = False,
           options: HFOptions | None = None) -> Path:
    options = options or HFOptions()
    run_dir, step = run_and_step(run_dir, step)
    notes: list[str] = []
    checkpoint = pick_checkpoint(run_dir, step, best, notes)
    cfg = OmegaConf.load(checkpoint.path / "config.yaml")
    assert isinstance(cfg, DictConfig)
    check_format(cfg, fmt)
    path = output_path(run_dir, checkpoint.step, fmt, out)
    for line in notes:  # after the refusals: a refused export is one line
        print(line, file=sys.stderr)
    consolidate = compute_seam.weights_export()

    tied = tied_weights(cfg) if fmt == "safetensors" else []  # save_pretrained finds them itself
    state = consolidate.load_model_state(checkpoint.path)
    if fmt == "safetensors":
        metadata = {"step": str(checkpoint.step), "model": str(cfg.model.name), "dtype": options.dtype}
        state = compute_seam.hf_export().cast(state, options.dtype)
        write_or_clean_up(path, lambda: consolidate.save_safetensors(state, path, metadata, tied))
    else:
        write_or_clean_up(path, lambda: export_hf(cfg, state, path, options))
    consolidate.follow_umask(path)
    return path


def export_hf(cfg: DictConfig, state: object, path: Path, options: HFOptions) -> None:
    hf = compute_seam.hf_export()
    shard = options.max_shard_size if options.max_shard_size is not None else hf.DEFAULT_SHARD
    try:
        exported = hf.export_hf(cfg, state, path, options.dtype, shard, options.verify)
    except hf.ExportMismatch as err:
        raise ExportMismatch(f"the Hugging Face directory did not reproduce the run's model: {err}: nothing was "
                             "written; please report it with the transformers version") from None
    for line in exported.lines:
        print(line, file=sys.stderr)


def tied_weights(cfg: DictConfig) -> list[list[str]]:
    """The run's tied weights, from its model built on the meta device; a model whose code can't be imported
    here is refused (naming the fix), one that can't be built on the meta device is exported without."""
    consolidate = compute_seam.weights_export()

    try:
        return consolidate.tied_groups(cfg.model)
    except ConfigError as err:
        raise ConfigError(f"finding the model's tied weights: {err}") from None
    except Exception as err:  # the user's model code: the export goes on, each tensor under every name
        cause = err.__cause__ or err
        reason = f"{type(cause).__name__}: {cause}".splitlines()[0]
        print(f"warning: building the model on the meta device failed ({reason}), so tied weights are stored "
              "under each of their names: load the file with model.load_state_dict(safetensors.torch.load_file("
              "PATH))", file=sys.stderr)
        return []


def add_checkpoint_choice(parser: argparse.ArgumentParser) -> argparse._MutuallyExclusiveGroup:
    """--step N or --best (export, sample, evaluate): which checkpoint of the run; the group, for a command that
    offers another choice besides them (evaluate's --all)."""
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, default=None, help="the checkpoint's step (default: the newest complete)")
    which.add_argument("--best", action="store_true",
                       help="the complete checkpoint that measured best: by the run's checkpoint.keep_best, else its "
                       "first validation set's loss")
    return which


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="python -m launcher.export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="the run directory (RUN_ROOT/RUN_NAME), or one checkpoint (RUN_DIR/checkpoints/step_N)")
    add_checkpoint_choice(parser)
    parser.add_argument("--format", choices=("safetensors", "hf"), default="safetensors")
    parser.add_argument("--out", default=None, help="where to write (default: RUN_DIR/export/...)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                        help="the weights' dtype as written (default float32, the checkpoint's)")
    parser.add_argument("--max-shard-size", default=None,
                        help="--format hf: split the safetensors past this size, with model.safetensors.index.json "
                        "(default: save_pretrained's, 50GB)")
    parser.add_argument("--no-verify", action="store_true",
                        help="--format hf: skip loading the export back and comparing it with the run's model; only "
                        "for a model whose check does not fit in this machine's memory")
    return parser


def main(argv: list[str] | None = None) -> int:
    from launcher.run.remote.commands import forward_or_none

    if (remote_code := forward_or_none("launcher.export", argv)) is not None:  # +remote=NAME or NAME:PATH
        return remote_code
    args = build_parser().parse_args(argv)
    try:
        if args.format != "hf" and (args.max_shard_size is not None or args.no_verify):
            raise ConfigError(f"{'--max-shard-size' if args.max_shard_size is not None else '--no-verify'} applies "
                              "to --format hf: drop it, or add --format hf")
        options = HFOptions(args.dtype, None if args.max_shard_size is None else shard_size(args.max_shard_size),
                            not args.no_verify)
        path = export(args.run_dir.expanduser().resolve(), args.step, args.format, args.out, args.best, options)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ExportMismatch as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    from launcher.commands import run

    run(main)
