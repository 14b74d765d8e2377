"""Hydra's own errors (a bad override, an unknown group option) as one line that names the fix.

Hydra prints these itself, over several lines, and exits 1 before our code runs. `python -m launcher` holds
standard error back until Hydra has composed the config (`release()`, called by our entry and our sweeper); when
Hydra exits first, the held text is turned into one `error:` line instead (`one_line`).
"""

from __future__ import annotations

import difflib
import io
import math
import re
import sys
from typing import Any, TextIO

from contract.config.suggest import close_key

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
    from contract.config import schema
    from launcher.checks import key_checks

    cls: type = schema.Config
    *parents, leaf = key.split(".")
    fixed: list[str] = []
    for part in parents:
        hint = key_checks._hints(cls).get(part)
        if hint is None:  # a misspelt section (loca.nproc): the section it most likely means
            part = close_key(part, list(key_checks._sections(cls))) or ""
            hint = key_checks._hints(cls).get(part)
        sub = key_checks._section_type(hint) if hint is not None else None
        if sub is None:
            return ""
        cls = sub
        fixed.append(part)
    meant = ".".join([*fixed, leaf])
    close = meant if meant != key and leaf in key_checks._hints(cls) else key_checks.suggest(meant, list(
        key_checks._hints(cls)))
    return f"did you mean {close}? " if close else ""


def _field(key: str) -> tuple[type | None, Any]:
    """(the section's dataclass when `key` names a section, the key's default otherwise) from the schema."""
    import dataclasses

    from contract.config import schema
    from launcher.checks import key_checks

    cls: Any = schema.Config
    *parents, leaf = key.split(".")
    for part in parents:
        cls = key_checks._sections(cls).get(part)
        if cls is None:
            return None, None
    field = next((f for f in dataclasses.fields(cls) if f.name == leaf), None)
    if field is None:
        return None, None
    return key_checks._sections(cls).get(leaf), field.default


def _wrong_type(override: str, key: str, problem: str) -> str | None:
    """A value of the wrong type for a key, or a value given to a whole section, as one line naming the fix."""
    value = override.split("=", 1)[1] if "=" in override else ""
    section, default = _field(key)
    if section is not None and "is not a subclass of" in problem:
        import dataclasses

        keys = [f.name for f in dataclasses.fields(section) if f.name != "name"]
        example = f"{key}.{keys[0]}={value}" if keys else f"{key}.KEY=VALUE"
        return (f"error: {override}: {key} is a section of keys, not a value: set one of its keys, e.g. {example} "
                f"(`python -m launcher --cfg job --package {key}` lists them)")
    number = re.match(r"Value '(.*)' of type '\w+' could not be converted to (Integer|Float)", problem)
    if number:
        kind = "a whole number" if number.group(2) == "Integer" else "a number"
        shown = f" (its default is {default})" if isinstance(default, (int, float)) and not isinstance(default, bool) \
            else ""
        return f"error: {override}: {key} takes {kind} and {number.group(1)!r} is not one: write {key}=N{shown}"
    if re.match(r"Value '.*' is not a valid bool", problem):
        return f"error: {override}: {key} is true or false: write {key}=true or {key}=false"
    return None


_YAML_ERROR = re.compile(r"(?:yaml\.\w+\.)?(?:Scanner|Parser|Composer|Constructor|Reader)Error: ?(.*)")
_MARK = re.compile(r'in "([^"]+)", line (\d+), column (\d+)')
YAML_FIX = "fix the YAML there (a missing bracket, quote or colon, or a wrong indentation)"


def yaml_syntax(text: str) -> str | None:
    """A YAML parser's error (in a traceback or alone) as `FILE, line L, column C: what it expected`, or None."""
    lines = [line.strip() for line in text.splitlines()]
    start = next((i for i, line in enumerate(lines) if _YAML_ERROR.match(line)), None)
    if start is None:
        return None
    first = _YAML_ERROR.match(lines[start])
    assert first is not None
    parts: list[str] = []
    marks: list[tuple[str, ...]] = []
    for line in [first.group(1), *lines[start + 1 :]]:
        mark = _MARK.fullmatch(line)
        if mark:
            marks.append(mark.groups())
        elif line and not line.startswith(("Traceback", "File ", "^", "During handling", "The above exception")):
            parts.append(line.rstrip(":"))
    what = ", ".join(parts) or "not valid YAML"
    if not marks:
        return what
    file, line, column = marks[0]
    later = [f"line {m[1]}, column {m[2]}" for m in marks[1:] if m[1:] != marks[0][1:]]
    return f"{file}, line {line}, column {column}: {what}" + (f" ({later[-1]})" if later else "")


def interpolation(err: Exception) -> str:
    """A `${...}` that does not resolve, with the key that holds it."""
    key = getattr(err, "full_key", None)
    where = f"{key}: " if key else ""
    return f"{where}{str(err).splitlines()[0]}: point the ${{...}} at a key that exists (`python -m launcher --cfg job` lists them)"


def one_line(text: str) -> str:
    syntax = yaml_syntax(text)
    if syntax is not None:
        if "found duplicate key" in syntax:
            return f"error: YAML error in {syntax}: keep one of the two (a key can be set once per file)"
        return f"error: YAML syntax error in {syntax}: {YAML_FIX}"
    lines = [line.strip() for line in text.splitlines()]
    # The key OmegaConf names (trainer.max_stesp inside trainer={max_stesp:5}): the override may set a whole section.
    inner = next((line.removeprefix("full_key:").strip() for line in lines if line.startswith("full_key:")), "")
    lines = [line for line in lines if line and not line.startswith(_NOISE)]
    if not lines:
        return "error: the command line could not be read: see `python -m launcher --help`"
    joined = "\n".join(lines)
    in_file = group_file_problem(joined)
    if in_file:
        return in_file
    from launcher.checks.group_choices import group_prefix_problem, plus_on_a_missing_option
    from launcher.checks.group_names import default_choices

    prefix = group_prefix_problem(joined)
    if prefix:
        return prefix
    unknown = re.search(r"Could not override '([^']+)'", joined)
    append = re.search(r"To append to your config use (\S+)", joined)
    if unknown and append and unknown.group(1).rsplit(".", 1)[0] in FREE_FORM:
        return f"error: {unknown.group(1)} is a new key of {unknown.group(1).rsplit('.', 1)[0]}: add it with {append.group(1)}"
    if unknown and "not in" in joined:
        key = inner if inner.startswith(f"{unknown.group(1)}.") else unknown.group(1)
        return (f"error: {key} is not a slurmtrain key: {_suggest(key)}check the spelling "
                "(`python -m launcher --cfg job` lists every key)")
    present = re.search(r"Could not append to config\. An item is already at '([^']+)'.*remove \+ prefix: '([^']+)'",
                        joined, re.S)
    if present:
        return f"error: {present.group(1)} is a slurmtrain key already: drop the + ({present.group(2)})"
    missing = re.search(r"Could not find '([^']+)'", joined)
    if missing:
        options = [line for line in lines if not line.startswith(("In '", "Available options"))]
        group = missing.group(1).rsplit("/", 1)[0]
        plus = plus_on_a_missing_option(group)
        if plus:
            return plus
        added = "" if group in default_choices() or "/" in group else "+"  # cluster, profile: added with a +
        given = missing.group(1).rsplit("/", 1)[-1]
        close = next(iter(difflib.get_close_matches(given, options, n=1, cutoff=0.6)), None)
        meant = f"did you mean {added}{group}={close}? " if close else ""
        return (f"error: Could not find '{missing.group(1)}': {meant}choose {added}{group}= one of "
                f"{', '.join(options)}")
    if lines[0].startswith("Additional config directory"):
        return f"error: {lines[0]}: point --config-dir at your project's conf directory"
    merging = re.match(r"Error merging override (.+)", lines[0])
    if merging and merging.group(1).startswith("~"):
        key = merging.group(1)[1:].split("=", 1)[0]
        if key.endswith(".name") and key.count(".") == 1:
            return f"error: {merging.group(1)}: {lines[-1]}: drop it (the name comes from the group option)"
        return f"error: {merging.group(1)}: {lines[-1]}: keys can't be removed; set {key}=VALUE instead"
    if lines[0].startswith("Could not delete"):
        return f"error: {lines[0]}: drop that ~ override"
    if merging and len(lines) > 1:
        key = merging.group(1).split("=", 1)[0].lstrip("+~")
        key = inner if inner.startswith(f"{key}.") else key  # a key inside a dict: trainer={max_steps:abc}
        if "is not a ListConfig" in lines[1] and "=" in merging.group(1):
            value = merging.group(1).split("=", 1)[1]
            return f"error: {merging.group(1)} is one value and {key} takes a list: write {key}=[{value}]"
        as_float = re.match(r"Value '([^']+)' of type 'float' could not be converted to Integer", lines[1])
        if as_float:  # 1e2 and 2.0 read as floats; the integer they mean is the fix
            value = float(as_float.group(1))
            typed = merging.group(1).split("=", 1)[1] if "=" in merging.group(1) else as_float.group(1)
            typed = as_float.group(1) if typed.startswith("{") else typed
            if value.is_integer():
                return (f"error: {merging.group(1)}: {key} takes an integer, and {typed} reads as the float "
                        f"{as_float.group(1)}: write {key}={int(value)}")
            return f"error: {merging.group(1)}: {key} takes an integer: give a whole number ({math.floor(value)} or " \
                   f"{math.ceil(value)})"
        return (_wrong_type(merging.group(1), key, lines[1])
                or f"error: {merging.group(1)}: {lines[1]}: give {key} a value of its type")
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
    unresolved = re.search(r"Interpolation\w*Error: (.+)", joined)
    if unresolved:
        return (f"error: {unresolved.group(1)}: point the ${{...}} at a key that exists (`python -m launcher --cfg "
                "job` lists them)")
    if any(line.startswith("Traceback (most recent call last)") for line in lines):
        return f"error: {_last_exception(lines)}: check the files that --config-dir and the overrides name"
    return "error: " + "; ".join(lines)


def argparse_problem(text: str) -> str | None:
    """Hydra's flags misused (`--cfg jbo`): argparse printed its usage and an error; one line naming the choices, or
    None when the text holds no argparse error."""
    said = next((m.group(1) for line in text.splitlines() if (m := re.match(r"^\S+: error: (.+)$", line.strip()))),
                None)
    if said is None:
        return None
    choice = re.match(r"argument ([-\w]+)(?:/[-\w]+)?: invalid choice: '([^']*)' \(choose from (.+)\)$", said)
    if choice:
        flag, given = choice.group(1), choice.group(2)
        choices = re.findall(r"'([^']*)'", choice.group(3))
        close = next(iter(difflib.get_close_matches(given, choices, n=1, cutoff=0.5)), None)
        fix = f"did you mean {flag} {close}?" if close else f"write {flag} with one of them"
        return f"error: {flag} {given} is not one of {', '.join(choices)}: {fix}"
    return f"error: {said}: see `python -m launcher --help` for the flags"


def group_file_problem(joined: str) -> str | None:
    """A group file (ours or the project's, e.g. conf/model/mine.yaml) that sets a key its section lacks or is not
    a mapping: the file, the key and the fix, or None."""
    where = re.match(r"In '([\w./-]+)/([\w.-]+)': \w+ raised while composing config", joined)
    if not where:
        return None
    group, name = where.groups()
    file = f"{group}/{name}.yaml (under conf/ or --config-dir)"
    section = group.split("/")[0]
    unknown = re.search(r"Key '([^']+)' not in '\w+'", joined)
    if unknown:
        key = unknown.group(1)
        close = _suggest(f"{section}.{key}").replace(f" {section}.", " ")  # as the file would write it
        return (f"error: {file} sets {key}, which is not a {section} key: {close}fix that file "
                f"(`python -m launcher --cfg job --package {section}` lists the keys)")
    wrong = re.search(r"Invalid type assigned: (\w+) is not a subclass of \w+", joined)
    if wrong:
        return (f"error: {file} holds a {wrong.group(1)} at its top level: a group file is a mapping of {section} "
                "keys, one `key: value` per line")
    return None


def _last_exception(lines: list[str]) -> str:
    """The last exception of a traceback, without the frames: `SomeError: what happened`."""
    frames = re.compile(r"^(File |\^+$|Traceback|During handling|The above exception)")
    heads = [i for i, line in enumerate(lines) if re.match(r"^[\w.]+(Error|Exception)\b:?", line)]
    if not heads:
        return "; ".join(line for line in lines if not frames.match(line))[-300:]
    tail = [line for line in lines[heads[-1] :] if not frames.match(line)]
    return "; ".join(tail)[:300]
