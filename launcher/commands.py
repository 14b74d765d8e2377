"""The commands a user types besides `python -m launcher`: each one's module and what it does in one line.

`python -m launcher --help` lists them (launcher/help.py) and the site's command reference prints each one's
--help from its parser (launcher/docs/commands_reference.py); every module here has `build_parser()`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from typing import NoReturn

from contract.errors import EXIT_BAD_INPUT

COMMANDS: tuple[tuple[str, str], ...] = (
    ("launcher.prepare", "turn a corpus (text, JSON Lines, Parquet) into token shards, locally or as a SLURM array"),
    ("launcher.status", "a table with one row per run (of a run, a sweep or a run root): step, loss, state, GPU-hours"),
    ("launcher.report", "PNG plots of a run, a sweep or a run root: loss, learning rate, gradient norm, tokens/s"),
    ("launcher.sample", "generate text from a run's checkpoint"),
    ("launcher.export", "a checkpoint as one safetensors file or a verified Hugging Face directory"),
    ("launcher.evaluate", "validation sets and lm-evaluation-harness tasks on a run's checkpoints"),
)


class CommandParser(argparse.ArgumentParser):
    """Every command's parser: a bad flag is one `error:` line naming the fix, exit 2 (argparse's own prints the
    usage first and prefixes the program's name; tests/unit/test_command_flags.py)."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message}: see {self.prog} --help", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def build_parser(module: str) -> argparse.ArgumentParser:
    """The command's own argparse parser, built as the command builds it (nothing parsed, nothing run)."""
    target = importlib.import_module(f"{module}.__main__" if module == "launcher.prepare" else module)
    parser: argparse.ArgumentParser = target.build_parser()
    return parser


def run(main: Callable[[], int | None]) -> NoReturn:
    """A command's `python -m` entry: its exit code, and a terminal's ways of ending it said in one line, not a
    traceback. `... | head` closing the pipe ends it quietly (exit 141, as the shell's SIGPIPE); Ctrl-C says so
    (exit 130). What it already wrote stays; what it writes it writes whole (exports verify, then move in place)."""
    try:
        code = main()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)  # the interpreter's flush at exit would raise again
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(141)
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C)", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)
