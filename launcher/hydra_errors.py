"""Hydra's own errors (a bad override, an unknown group option) as one line that names the fix.

Hydra prints these itself, over several lines, and exits 1 before our code runs. `python -m launcher` holds
standard error back until Hydra has composed the config (`release()`, called by our entry and our sweeper); when
Hydra exits first, the held text is turned into one `error:` line instead (`one_line`).
"""

from __future__ import annotations

import io
import re
import sys
from typing import TextIO

_held: io.StringIO | None = None
_real: TextIO | None = None
# Dicts whose keys are the user's own (a target's arguments, environment, sbatch options): new keys take a `+`.
FREE_FORM = ("model.args", "data.args", "cluster.env", "cluster.extra_sbatch", "cluster.peak_tflops")
_NOISE = ("Set the environment variable HYDRA_FULL_ERROR", "full_key:", "reference_type=", "object_type=",
          "Config search path:", "provider=")


def hold() -> None:
    global _held, _real
    _real, _held = sys.stderr, io.StringIO()
    sys.stderr = _held


def release() -> None:
    """Let standard error through again, with whatever was held (warnings) first."""
    global _held, _real
    if _held is None or _real is None:
        return
    text = _held.getvalue()
    sys.stderr, _held, _real = _real, None, None
    if text:
        sys.stderr.write(text)
        sys.stderr.flush()


def take() -> str:
    """Stop holding and return the held text, unprinted."""
    global _held, _real
    if _held is None or _real is None:
        return ""
    text = _held.getvalue()
    sys.stderr, _held, _real = _real, None, None
    return text


def _suggest(key: str) -> str:
    import difflib
    import typing

    from launcher import key_checks, schema

    cls: type = schema.Config
    *parents, leaf = key.split(".")
    for part in parents:
        hint = typing.get_type_hints(cls, vars(schema)).get(part)
        sub = key_checks._section_type(hint) if hint is not None else None
        if sub is None:
            return ""
        cls = sub
    close = difflib.get_close_matches(leaf, list(typing.get_type_hints(cls, vars(schema))), n=1)
    return f"did you mean {'.'.join([*parents, close[0]])}? " if close else ""


def one_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith(_NOISE)]
    if not lines:
        return "error: the command line could not be read: see `python -m launcher --help`"
    joined = "\n".join(lines)
    unknown = re.search(r"Could not override '([^']+)'", joined)
    append = re.search(r"To append to your config use (\S+)", joined)
    if unknown and append and unknown.group(1).rsplit(".", 1)[0] in FREE_FORM:
        return f"error: {unknown.group(1)} is a new key of {unknown.group(1).rsplit('.', 1)[0]}: add it with {append.group(1)}"
    if unknown and "not in" in joined:
        key = unknown.group(1)
        return (f"error: {key} is not a slurmtrain key: {_suggest(key)}check the spelling "
                "(`python -m launcher --cfg job` lists every key)")
    missing = re.search(r"Could not find '([^']+)'", joined)
    if missing:
        options = [line for line in lines if not line.startswith(("In '", "Available options"))]
        group = missing.group(1).rsplit("/", 1)[0]
        return f"error: Could not find '{missing.group(1)}': choose {group}= one of {', '.join(options)}"
    if lines[0].startswith("Additional config directory"):
        return f"error: {lines[0]}: point --config-dir at your project's conf directory"
    merging = re.match(r"Error merging override (.+)", lines[0])
    if merging and merging.group(1).startswith("~"):
        key = merging.group(1)[1:].split("=", 1)[0]
        return f"error: {merging.group(1)}: {lines[-1]}: keys can't be removed; set {key}=VALUE instead"
    if lines[0].startswith("Could not delete"):
        return f"error: {lines[0]}: drop that ~ override"
    if merging and len(lines) > 1:
        key = merging.group(1).split("=", 1)[0].lstrip("+~")
        return f"error: {merging.group(1)}: {lines[1]}: give {key} a value of its type"
    if "LexerNoViableAltException" in joined and "~" in joined:
        return ("error: Hydra's override grammar reads ~ as a deletion: quote a path that starts with ~ "
                "('data.path=\"~/file\"') or write $HOME/... instead")
    if "Unexpected type for root" in joined:
        return ("error: a cluster.* or profile.* key was set without its section: add +cluster=NAME (or "
                "+profile=default) before its keys")
    if "does not support sweep type" in joined:
        return ("error: this sweep type is not supported by the basic sweeper: sweep with comma lists (a=1,2), "
                "range(start,stop[,step]) or choice(a,b)")
    if len(lines) > 1 and lines[-1].startswith("See https://hydra.cc"):
        return f"error: {'; '.join(lines[:-1])}: write overrides as key=value ({lines[-1][4:]})"
    return "error: " + "; ".join(lines)
