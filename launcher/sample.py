"""python -m launcher.sample RUN_DIR [--step N | --best] (--prompt TEXT [--chat] | --tokens 1,2,3) [--tokenizer T]
[--max-new-tokens K] [--temperature T] [--top-k K] [--seed S] [--ids] [--no-cache]

Generates from a run's checkpoint (the newest complete one, --step N, or --best: the one that measured best, as
launcher.export --best), written by any number of ranks with any strategy, on this machine (one process; a GPU
when there is one), each new token reading a key/value cache (--no-cache: the whole window re-run per token; the
same output): greedy by default (--temperature 0), or sampled from softmax(logits / T) over the --top-k most likely
ids. --prompt is encoded with the run's tokenizer (the one
its prepared dataset names); a run without one (synthetic data, token files, a dataset of its own) takes the
prompt as ids with --tokens, or names a tokenizer with --tokenizer (`bytes`, a tokenizer.json or a directory
holding one). --chat renders the prompt as a user turn with the tokenizer's chat template and its generation prompt
(contract/data/sft.py, as launcher.prepare rendered supervised fine-tuning chats) and prints only the reply.
Prints the prompt and its continuation (with --chat, the reply alone): as text when the run has a tokenizer, as ids
otherwise (or with --ids).
Generation stops early at the run's end-of-document id.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from contract.data.run_tokenizer import BYTES, RunTokenizer, run_tokenizer
from contract.errors import EXIT_BAD_INPUT, ConfigError
from launcher import compute_seam
from launcher.commands import CommandParser
from launcher.export import add_checkpoint_choice, pick_checkpoint, run_and_step


def parse_ids(text: str, vocab_size: int) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--tokens {text!r} is not a list of ids: write them comma-separated, --tokens 1,2,3") \
            from None
    if not ids:
        raise ConfigError("--tokens is empty: give at least one id, --tokens 1,2,3")
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise ConfigError(f"--tokens holds {bad[0]}, outside the model's vocabulary of {vocab_size} "
                          f"(model.vocab_size): give ids from 0 to {vocab_size - 1}")
    return ids


def check_sampling(args: argparse.Namespace) -> None:
    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens {args.max_new_tokens}: give 1 or more")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise ConfigError(f"--temperature {args.temperature}: give 0 (greedy) or a positive number")
    if args.top_k < 0:
        raise ConfigError(f"--top-k {args.top_k}: give 0 (the whole vocabulary) or a positive count")
    if args.top_k and args.temperature == 0:
        raise ConfigError("--top-k applies to sampling, and --temperature 0 is greedy: give --temperature T > 0 "
                          "too, or leave --top-k out")


def prompt_ids(args: argparse.Namespace, tokenizer: RunTokenizer | None, why_none: str, run_dir: Path,
               vocab_size: int) -> list[int]:
    if args.tokens is not None:
        return parse_ids(args.tokens, vocab_size)
    if tokenizer is None:
        raise ConfigError(f"--prompt needs the run's tokenizer, and {run_dir} has none ({why_none}): name one with "
                          "--tokenizer T (bytes, a tokenizer.json or its directory)"
                          + ("" if getattr(args, "chat", False) else ", or give the prompt as token ids with --tokens "
                             "1,2,3"))
    if not args.prompt:
        raise ConfigError("--prompt is empty: give some text to continue")
    unknown = tokenizer.unknown_characters(args.prompt)
    shown = ", ".join(repr(c) for c in unknown[:10]) + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
    ids = tokenizer.encode(chat_prompt(args.prompt, tokenizer) if args.chat else args.prompt)
    if not ids:
        why = f" ({tokenizer.name} has none for {shown})" if unknown else ""
        raise ConfigError(f"--prompt encodes to no token at all{why}: give a prompt in the run's vocabulary, or ids "
                          "with --tokens")
    if unknown:
        print(f"sample: {tokenizer.name} has no token for {shown} of --prompt: the model does not see "
              f"{'it' if len(unknown) == 1 else 'them'}", file=sys.stderr)
    bad = [i for i in ids if i >= vocab_size]
    if bad:
        raise ConfigError(f"--prompt encodes to id {bad[0]}, outside the model's vocabulary of {vocab_size}: "
                          "give a prompt in the run's vocabulary, or ids with --tokens")
    return ids


def chat_prompt(text: str, tokenizer: RunTokenizer) -> str:
    from contract.data.sft import chat_template

    template = chat_template(tokenizer.path)
    if template is None:
        raise ConfigError(f"--chat renders the prompt with the tokenizer's chat template, and {tokenizer.name} has "
                          "none (no chat_template.jinja, nor a chat_template in a tokenizer_config.json, beside its tokenizer.json): drop --chat, "
                          "or give --tokenizer DIR whose tokenizer_config.json has one")
    try:
        return template.prompt(text)
    except ValueError as err:
        raise ConfigError(f"--chat: {err}: fix the template") from None


def given_tokenizer(spec: str) -> RunTokenizer:
    """--tokenizer: `bytes`, a tokenizer.json or a directory holding one, with its end-of-document id as
    launcher.prepare chooses it."""
    from launcher.prepare.tokenizer import load_tokenizer

    choice = load_tokenizer(spec)
    return RunTokenizer(choice.info.path or BYTES, choice.eod_id, choice.info.path)


def load_config(step_dir: Path) -> DictConfig:
    path = step_dir / "config.yaml"
    try:
        cfg = OmegaConf.load(path)
    except Exception as err:  # a missing or unparseable file: OSError, yaml's errors
        raise ConfigError(f"{path} can't be read ({type(err).__name__}): pick another checkpoint with --step N") \
            from None
    if not isinstance(cfg, DictConfig) or "model" not in cfg or "data" not in cfg:
        raise ConfigError(f"{path} is not a run's config: pick another checkpoint with --step N")
    return cfg


def describe(args: argparse.Namespace) -> str:
    if args.temperature == 0:
        return "greedy"
    return f"temperature {args.temperature:g}, {f'top-k {args.top_k}' if args.top_k else 'no top-k'}, " \
           f"seed {args.seed}"


def sample(args: argparse.Namespace) -> str:
    check_sampling(args)
    run_dir, step = run_and_step(args.run_dir.expanduser().resolve(), args.step)
    notes: list[str] = []
    checkpoint = pick_checkpoint(run_dir, step, args.best, notes)
    cfg = load_config(checkpoint.path)
    if args.chat and args.prompt is None:
        raise ConfigError("--chat renders a text prompt: give --prompt TEXT (not --tokens)")
    tokenizer, why_none = (given_tokenizer(args.tokenizer), "") if args.tokenizer else run_tokenizer(cfg.data)
    ids = prompt_ids(args, tokenizer, why_none, run_dir, int(cfg.model.vocab_size))
    stop_id = tokenizer.eod_id if tokenizer is not None else None
    for line in notes:  # after the refusals: a refused sample is one line
        print(line, file=sys.stderr)
    print(f"sample: {checkpoint.path} ({describe(args)}, tokenizer {tokenizer.name if tokenizer else 'none'})",
          file=sys.stderr)

    sampler = compute_seam.sampling()
    sampling = sampler.Sampling(args.max_new_tokens, args.temperature, args.top_k, args.seed, stop_id,
                                cache=not args.no_cache)
    new = sampler.sample(checkpoint.path, cfg.model, ids, sampling)
    if tokenizer is None or args.ids:
        return ",".join(map(str, new if args.chat else ids + new))
    if new and new[-1] == stop_id:
        new = new[:-1]
        print("sample: stopped at the end-of-document id", file=sys.stderr)
    return tokenizer.decode(new if args.chat else ids + new)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="python -m launcher.sample", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="the run directory (RUN_ROOT/RUN_NAME), or one checkpoint (RUN_DIR/checkpoints/step_N)")
    add_checkpoint_choice(parser)
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt", help="text to continue, encoded with the run's tokenizer")
    given.add_argument("--tokens", help="the prompt as comma-separated token ids")
    parser.add_argument("--tokenizer", metavar="T",
                        help="encode and decode with this tokenizer (`bytes`, a tokenizer.json or a directory holding "
                        "one) instead of the run's: for a run without a prepared dataset")
    parser.add_argument("--chat", action="store_true",
                        help="render --prompt as a user turn with the tokenizer's chat template (its "
                        "tokenizer_config.json) and print only the reply")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="how many ids to generate (default 64)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; above 0: sample")
    parser.add_argument("--top-k", type=int, default=0, help="sample among the k most likely ids (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="the sampling seed (default 0)")
    parser.add_argument("--ids", action="store_true",
                        help="print token ids, not text (with --chat, the reply's ids, its end-of-document id "
                        "included when it stopped there)")
    parser.add_argument("--no-cache", action="store_true",
                        help="re-run the whole window for every new token instead of reading the key/value cache "
                        "(slower; the same output)")
    return parser


def main(argv: list[str] | None = None) -> int:
    from launcher.run.remote.commands import forward_or_none

    if (remote_code := forward_or_none("launcher.sample", argv)) is not None:  # +remote=NAME or NAME:PATH
        return remote_code
    args = build_parser().parse_args(argv)
    try:
        print(sample(args))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    from launcher.commands import run

    run(main)
