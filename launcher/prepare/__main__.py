"""python -m launcher.prepare INPUTS... --out DIR --tokenizer T [options] [+cluster=NAME [cluster.KEY=VALUE]
    [container=RUNTIME container.image=IMAGE [container.KEY=VALUE]]]

Turns a corpus into a prepared dataset directory (see contract/data/manifest.py): checks everything it can
before writing anything, then prepares locally over worker processes, or with +cluster=NAME submits one SLURM
CPU job array (a task per group of input files) and a finalize job, and returns at once; with container=RUNTIME
(the training job's container group and keys) those jobs run in the image.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from contract.data.manifest import Manifest
from contract.errors import EXIT_BAD_INPUT, ConfigError
from launcher.commands import CommandParser
from launcher.prepare.container import split_overrides
from launcher.prepare.inputs import ENCODING_ERRORS
from launcher.prepare.plan import DEFAULT_TASK_MB, DEFAULT_VAL_FRACTION, Options, Plan, make_plan
from launcher.prepare.pool import AUTO_MB_PER_WORKER, cpu_count
from launcher.prepare.run import skipped_line

EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser(
        prog="python -m launcher.prepare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="files, directories (searched recursively) or globs: text, JSON Lines (.jsonl/.ndjson/"
        ".json) or Parquet (.parquet); .gz, .zst, .bz2 and .xz are read as they are; binary files found in a "
        "directory or by a glob are skipped, and so are compressed ones that can't be read to their end (one "
        "named is refused)",
    )
    p.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="GLOB",
        help="read only the files found in a directory (or by a glob) whose path under it matches GLOB, as in "
        ".gitignore: '*.py' at any depth, 'src/**/*.md', 'docs/' (repeatable: any of them)",
    )
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="leave out the files found whose path under their directory matches GLOB (repeatable; wins over "
        "--include); files named one by one are never filtered",
    )
    p.add_argument(
        "--encoding-errors",
        choices=ENCODING_ERRORS,
        default=None,
        help="text that is not UTF-8: strict (refuse it, naming the file and the fix), skip (leave the whole "
        "file out, counted in the summary and the manifest) or replace (with U+FFFD); default: skip for files "
        "found in a directory or by a glob, strict for files named one by one",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="stop at a file found in a directory or by a glob whose first record is not in its extension's format "
        "(a .json or .json.gz that is not JSON Lines, a .parquet that is not Parquet) or whose compressed stream "
        "can't be read to its end, naming every --exclude "
        "needed; default: skip it (counted in the summary and the manifest), as binary files are",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="the prepared dataset directory")
    p.add_argument(
        "--tokenizer",
        required=True,
        metavar="T",
        help="a local Hugging Face tokenizer.json, a directory holding one, or `bytes` (UTF-8 bytes: "
        "ids 0-255, end of document 256)",
    )
    p.add_argument(
        "--train-tokenizer",
        metavar="bpe:VOCAB",
        help="train a byte-level BPE of VOCAB tokens (the `tokenizers` library) on the documents this preparation "
        "selects and reads, save it where --tokenizer DIR names (as save_pretrained writes one: tokenizer.json, "
        "tokenizer_config.json with the end-of-document token as eos_token), then prepare with it; the same "
        "command again keeps it",
    )
    p.add_argument(
        "--chat-template",
        metavar="FILE",
        help="with --train-tokenizer: a Jinja chat template saved beside it as chat_template.jinja",
    )
    p.add_argument(
        "--eod-token",
        metavar="TOKEN",
        help="the token appended after every document (default: the tokenizer's eos_token, else "
        "<|endoftext|>, </s>, ... when the vocabulary has one)",
    )
    p.add_argument(
        "--text-field",
        default="text",
        metavar="NAME",
        help="the JSON Lines field / Parquet column holding the text (default: text)",
    )
    p.add_argument(
        "--prompt-field",
        metavar="NAME",
        help="supervised fine-tuning: JSON Lines records of a prompt (this field) and a response "
        "(--response-field); only the response's tokens count in the loss (a loss mask beside the tokens). "
        "Rendered as one user and one assistant turn with the tokenizer's chat template when its "
        "tokenizer_config.json has one, else the prompt's text then the response's",
    )
    p.add_argument("--response-field", metavar="NAME", help="the response's field of --prompt-field records")
    p.add_argument(
        "--messages-field",
        metavar="NAME",
        help="supervised fine-tuning: JSON Lines records whose field NAME is a chat ([{\"role\": ..., "
        "\"content\": ...}]), rendered with the tokenizer's chat template; only the assistant turns count "
        "in the loss",
    )
    p.add_argument(
        "--text-per-line",
        action="store_true",
        help="text files hold one document per line (default: one document per file)",
    )
    p.add_argument(
        "--val-fraction",
        type=float,
        default=DEFAULT_VAL_FRACTION,
        metavar="F",
        help=f"share of documents in the validation split, chosen by a hash of each document's text "
        f"(default: {DEFAULT_VAL_FRACTION})",
    )
    p.add_argument(
        "--split-seed",
        type=int,
        default=0,
        metavar="N",
        help="key of that hash: another seed, another split (default: 0)",
    )
    p.add_argument(
        "--task-mb",
        type=float,
        default=DEFAULT_TASK_MB,
        metavar="MB",
        help=f"input megabytes per task (a group of files writing its own shards; default: "
        f"{DEFAULT_TASK_MB:g})",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help=f"worker processes on this machine (default: the CPU count, {cpu_count()} here, but one per "
        f"{AUTO_MB_PER_WORKER:g} MB of input at most: a smaller corpus is tokenized in this process, on "
        f"every core); the output is the same for any number",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace a different preparation already in --out"
    )
    p.add_argument(
        "--config-dir",
        metavar="DIR",
        help="with +cluster=NAME: a directory whose cluster/NAME.yaml is looked up before slurmtrain's own",
    )
    return p


def _check_options(args: argparse.Namespace) -> None:
    if not 0.0 <= args.val_fraction < 1.0:
        raise ConfigError(
            f"--val-fraction {args.val_fraction} is outside [0, 1): give the share of documents "
            f"for validation, e.g. 0.005"
        )
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: give at least 1")
    if not args.task_mb > 0:
        raise ConfigError(f"--task-mb {args.task_mb}: give a positive size in megabytes, e.g. 256")


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}" if n == 1 else f"{n:,} {what}s"


def _summary(manifest: Manifest, plan: Plan, written: int) -> str:
    parts = []
    for name in ("train", "val"):
        s = manifest.split(name)
        if manifest.sft is None:
            what = f"{_count(s.tokens, 'token')} ({_count(s.documents, 'document')}"
        else:
            what = (f"{_count(s.tokens, 'token')} ({s.response_tokens:,} response tokens, "
                    f"{_count(s.documents, 'record')}")
        parts.append(f"{name} {what}, {_count(len(s.shards), 'shard')})")
    total = len(plan.tasks)
    if not written:
        how = f"already complete ({_count(total, 'task')})"
    elif written < total:
        how = f"{written} of {_count(total, 'task')} written, the others were complete"
    else:
        how = _count(total, "task")
    skipped = skipped_line(manifest)
    return (
        f"prepared {plan.out}: {', '.join(parts)}; {how}\n"
        f"tokenizer {plan.tokenizer.describe()}; dtype {manifest.dtype}; fingerprint {manifest.fingerprint}"
        + (f"\n{_sft_line(manifest.sft)}" if manifest.sft else "")
        + (f"\n{skipped}" if skipped else "")
    )


def _sft_line(sft: Mapping[str, Any]) -> str:
    how = ("rendered with the tokenizer's chat template" if sft.get("rendering") == "chat_template" else
           "the prompt's text then the response's (the tokenizer has no chat template)")
    return f"supervised fine-tuning records: {how}; a loss mask beside the tokens counts only the responses"


def _check_writable(out: Path, tokenizer_dir: Path | None) -> None:
    """--out (and the directory a tokenizer is trained into) can be written: refused before anything is read,
    trained or created."""
    from launcher.checks.paths import unwritable
    from launcher.prepare.run import refuse_a_file

    refuse_a_file(out)
    why = unwritable(out)
    if why is not None:
        raise ConfigError(f"--out {out} can't be written ({why}): give --out a directory you can write")
    if tokenizer_dir is not None:
        if tokenizer_dir.exists() and not tokenizer_dir.is_dir():
            raise ConfigError(f"--tokenizer {tokenizer_dir} is a file: --train-tokenizer saves a tokenizer directory "
                              "there; give a directory")
        why = unwritable(tokenizer_dir)
        if why is not None:
            raise ConfigError(f"--tokenizer {tokenizer_dir} can't be written ({why}): --train-tokenizer saves the "
                              "tokenizer there; give a directory you can write")


def main(argv: list[str] | None = None) -> int:
    argv, cluster, cluster_overrides, container = split_overrides(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    try:
        from launcher.prepare.documents import check_columns, check_formats
        from launcher.prepare.filters import canonical
        from launcher.prepare.inputs import resolve_inputs
        from launcher.prepare.slurm import check_first, submit
        from launcher.prepare.tokenizer import load_tokenizer

        _check_options(args)
        out = Path(args.out).expanduser().resolve()
        check_first(cluster, cluster_overrides, args.config_dir, container, out)
        options = Options(
            text_field=args.text_field,
            text_per_line=args.text_per_line,
            val_fraction=args.val_fraction,
            split_seed=args.split_seed,
            task_mb=args.task_mb,
            include=canonical(args.include),
            exclude=canonical(args.exclude),
            encoding_errors=args.encoding_errors,
            strict=args.strict,
            prompt_field=args.prompt_field,
            response_field=args.response_field,
            messages_field=args.messages_field,
        )
        if args.chat_template is not None and args.train_tokenizer is None:
            raise ConfigError("--chat-template goes with --train-tokenizer (saved beside the tokenizer it trains): add "
                              "--train-tokenizer bpe:VOCAB, or put the template in your tokenizer's directory as "
                              "chat_template.jinja")
        sft = bool(args.prompt_field or args.response_field or args.messages_field)
        trained = None
        if args.train_tokenizer is not None:
            from launcher.prepare import train_tokenizer

            trained = train_tokenizer.check_request(args.train_tokenizer, args.tokenizer, args.chat_template, sft)
        _check_writable(out, trained[1] if trained is not None else None)
        inputs = resolve_inputs(args.inputs, out, options.filters)
        if trained is not None:
            check_columns(inputs, options.read)
            check_formats(inputs, options.read)
            vocab, directory, template_text = trained
            eod = args.eod_token or train_tokenizer.DEFAULT_EOD
            training = train_tokenizer.training_of(vocab, eod, template_text, options.read, inputs)
            if train_tokenizer.already_trained(directory, training):
                print(f"tokenizer {directory}: trained on these documents already ({train_tokenizer.RECORD})")
            else:
                print(train_tokenizer.train(directory, training, template_text, inputs, options.read))
        tokenizer = load_tokenizer(args.tokenizer, args.eod_token)
        if sft:
            from contract.data.sft import chat_template
            from launcher.prepare.sft_records import check_sft_options

            template = chat_template(tokenizer.info.path)
            check_sft_options(options, template, args.tokenizer, inputs)
            options = replace(options, chat_template=None if template is None else template.sha256)
        check_columns(inputs, options.read)
        check_formats(inputs, options.read)
        plan = make_plan(out, tokenizer, options, inputs)
        if cluster is not None:
            print(submit(plan, cluster, cluster_overrides, args.config_dir, args.overwrite, container))
            return 0
        from launcher.prepare.pool import Interrupted, WorkerDied
        from launcher.prepare.run import prepare_local

        try:
            manifest, written = prepare_local(plan, args.workers, args.overwrite)
        except Interrupted:
            print(
                f"interrupted: the finished tasks are kept in {out}; run the same command again to resume",
                file=sys.stderr,
            )
            return EXIT_INTERRUPTED
        except WorkerDied as err:
            print(
                f"error: a worker process died ({err}): run the same command again to resume (the finished "
                f"tasks are kept)",
                file=sys.stderr,
            )
            return 1
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(_summary(manifest, plan, written))
    return 0


if __name__ == "__main__":
    from launcher.commands import run

    run(main)
