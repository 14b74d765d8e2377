"""docs/reference/config.md, generated from the schema (contract/config/): every key with its type, default, range,
choices and the comment above it in the dataclass source, so the reference cannot drift from the code."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import textwrap
import tokenize
import typing
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from contract.config.schema import Config
from launcher.checks.group_names import CONF_DIR, default_choices, our_options
from launcher.checks.key_checks import CHOICES

# Comments after a key that are for tools, not readers.
_PRAGMAS = ("type:", "noqa", "pragma")


@dataclass(frozen=True)
class KeyDoc:
    name: str  # dotted: optim.lr
    type: str  # as annotated: int | None
    default: str  # as a user would type it; "required" for a missing one
    range: str  # [0, 1), or "" when the schema declares none
    choices: tuple[str, ...]
    doc: str  # the comment above the key (and after it on its line), "" when it has none


def _section(hint: Any) -> type | None:
    for candidate in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(candidate):
            return candidate  # type: ignore[return-value]
    return None


@functools.cache
def _comments(cls: type) -> dict[str, str]:
    """Field name -> its comment: the block of `#` lines directly above it, then the one after it on its line."""
    lines, first = inspect.getsourcelines(cls)
    source = textwrap.dedent("".join(lines))
    inline: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            inline[tok.start[0]] = tok.string
    text = source.splitlines()
    out: dict[str, str] = {}
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.ClassDef)
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        above: list[str] = []
        row = stmt.lineno - 1  # 1-based line above the field
        while row >= 1 and text[row - 1].strip().startswith("#"):
            above.insert(0, text[row - 1].strip().lstrip("#").strip())
            row -= 1
        after = inline.get(stmt.lineno, "").lstrip("#").strip()
        if after.startswith(_PRAGMAS) or text[stmt.lineno - 1].strip().startswith("#"):
            after = ""  # a tool's pragma explains nothing
        out[stmt.target.id] = " ".join(part for part in (" ".join(above), after) if part)
    return out


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return "required" if value == MISSING else (value or '""')
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    return repr(value) if isinstance(value, float) else str(value)


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        return _value(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return _value(f.default_factory())
    return "required"


def _range(f: dataclasses.Field[Any]) -> str:
    bounds = f.metadata.get("range")
    if bounds is None:
        return ""
    lo, hi, lo_open, hi_open = bounds
    left = "(" if lo_open or lo is None else "["
    right = ")" if hi_open or hi is None else "]"
    return f"{left}{'-inf' if lo is None else _value(lo)}, {'inf' if hi is None else _value(hi)}{right}"


def schema_keys(cls: type = Config, prefix: str = "") -> list[KeyDoc]:
    """Every key of the schema, depth first in declaration order; a section (a dataclass) is not a key itself."""
    hints = typing.get_type_hints(cls)
    comments = _comments(cls)
    out: list[KeyDoc] = []
    for f in dataclasses.fields(cls):
        name = f"{prefix}{f.name}"
        sub = _section(hints[f.name])
        if sub is not None:
            out.extend(schema_keys(sub, f"{name}."))
            continue
        choices = tuple(str(c) for c in CHOICES.get(name, ()) if c is not None)
        if f.name == "name" and prefix.rstrip(".") in default_choices():
            choices = tuple(our_options(prefix.rstrip(".")))
        out.append(KeyDoc(name, str(f.type), _default(f), _range(f), choices, comments.get(f.name, "")))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def undocumented(keys: list[KeyDoc]) -> list[str]:
    return [key.name for key in keys if not key.doc]


def render() -> str:
    keys = schema_keys()
    if missing := undocumented(keys):
        raise ValueError(f"config keys without a comment: {', '.join(missing)}: explain each in a comment on the "
                         "line above it in contract/config/ (the reference shows it)")
    lines = [
        "# Configuration reference",
        "",
        "Every key slurmtrain reads, generated from the schema (`contract/config/`) when the site is built: its type,",
        "its default, the range and the choices the launch checks enforce, and the comment that explains it in the",
        "source. Set a key on the command line (`python -m launcher optim.lr=1e-3`) or in a YAML file of a group.",
        "A key the schema does not declare is refused before anything runs.",
        "",
        "## Groups",
        "",
        "A group option (`model=tiny`) sets many keys at once from `conf/GROUP/OPTION.yaml`.",
        "",
        "| group | options | default |",
        "|---|---|---|",
    ]
    defaults = default_choices()
    for group in _groups():
        options = ", ".join(f"`{o}`" for o in our_options(group))
        lines.append(f"| `{group}` | {options} | {f'`{defaults[group]}`' if group in defaults else f'none: add one with `+{group}=NAME`'} |")
    section = ""
    for key in keys:
        top = key.name.split(".", 1)[0]
        if top != section:
            section = top
            lines += ["", f"## {section}", "", "| key | type | default | range or choices | what it does |",
                      "|---|---|---|---|---|"]
        allowed = ", ".join(f"`{c}`" for c in key.choices) if key.choices else (f"`{key.range}`" if key.range else "")
        lines.append(f"| `{key.name}` | `{_cell(key.type)}` | `{_cell(key.default)}` | {_cell(allowed)} | "
                     f"{_cell(key.doc)} |")
    return "\n".join(lines) + "\n"


def _groups() -> list[str]:
    return sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and any(p.glob("*.yaml")))
