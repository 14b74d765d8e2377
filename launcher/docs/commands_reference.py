"""docs/reference/commands.md, generated from each command's argparse parser (launcher/commands.py): its --help as
the command prints it, so the reference cannot drift from the flags."""

from __future__ import annotations

import os
from unittest import mock

from launcher.commands import COMMANDS, build_parser

# argparse wraps to the terminal's width (COLUMNS); a fixed one keeps the page the same on every machine.
WIDTH = "100"


def help_text(module: str) -> str:
    with mock.patch.dict(os.environ, {"COLUMNS": WIDTH}):
        return build_parser(module).format_help().rstrip()


def render() -> str:
    lines = [
        "# Command reference",
        "",
        "Every command besides `python -m launcher` (whose keys are in the [configuration reference](config.md)),",
        "with its `--help` as it prints it, generated from the command's parser when the site is built.",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    lines += [f"| [`python -m {m}`](#{m.replace('.', '')}) | {what} |" for m, what in COMMANDS]
    for module, what in COMMANDS:
        lines += ["", f"## {module}", "", what[0].upper() + what[1:] + ".", "", "```text", help_text(module), "```"]
    return "\n".join(lines) + "\n"
