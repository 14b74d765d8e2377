"""A preparation's plan: its identity (inputs, tokenizer, options) and its tasks, stored in DIR/.parts/plan.json.

A task is a run of consecutive input files (sorted by path) of about `task_mb` megabytes on disk (at least one
file), so the tasks, and therefore the shards, depend only on the inputs and the options, never on the number of
workers or on where the tasks run. Task N writes train/NNNNN.bin and val/NNNNN.bin (each only when it has
documents for that split), then its completion record .parts/NNNNN.json.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from contract.data.manifest import TokenizerInfo
from contract.errors import ConfigError
from launcher.prepare.filters import Filters
from launcher.prepare.inputs import InputFile, ReadOptions
from launcher.prepare.tokenizer import TokenizerChoice

PARTS = ".parts"
PLAN = "plan.json"
# 2: --include/--exclude/--encoding-errors, and whether each input was named or found (binary files skipped).
VERSION = 2
DEFAULT_TASK_MB = 256.0
DEFAULT_VAL_FRACTION = 0.005
SFT_OPTIONS = ("prompt_field", "response_field", "messages_field", "chat_template")


@dataclass(frozen=True)
class Options:
    text_field: str = "text"
    text_per_line: bool = False
    val_fraction: float = DEFAULT_VAL_FRACTION
    split_seed: int = 0
    task_mb: float = DEFAULT_TASK_MB
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    encoding_errors: str | None = None  # None: strict for files named one by one, skip for files found
    strict: bool = False  # --strict: a file found that is not in its extension's format stops the run
    # Supervised fine-tuning records (contract/data/sft.py): prompt/response fields or a messages field, and the
    # chat template's digest when the tokenizer has one (another template, another preparation). None: plain text.
    prompt_field: str | None = None
    response_field: str | None = None
    messages_field: str | None = None
    chat_template: str | None = None

    @property
    def sft(self) -> dict[str, Any] | None:
        """What the manifest records of supervised fine-tuning records (None: plain text)."""
        if self.messages_field is None and self.prompt_field is None:
            return None
        fields = ({"messages_field": self.messages_field} if self.messages_field is not None else
                  {"prompt_field": self.prompt_field, "response_field": self.response_field})
        rendering = "raw" if self.chat_template is None else "chat_template"
        return {**fields, "rendering": rendering, "chat_template": self.chat_template}

    @property
    def read(self) -> ReadOptions:
        return ReadOptions(self.text_field, self.text_per_line, self.encoding_errors, self.strict)

    @property
    def filters(self) -> Filters:
        return Filters(self.include, self.exclude)

    def selection(self) -> dict[str, Any]:
        """How the inputs were chosen and read, as the manifest records it."""
        return {
            "include": list(self.include),
            "exclude": list(self.exclude),
            "encoding_errors": {
                "named": self.encoding_errors or "strict",
                "found": self.encoding_errors or "skip",
            },
        }

    @staticmethod
    def from_json(raw: dict[str, Any]) -> Options:
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
        return Options(**values)


@dataclass(frozen=True)
class Plan:
    out: str  # absolute path of the dataset directory (not part of the identity)
    tokenizer: TokenizerChoice
    options: Options
    inputs: tuple[InputFile, ...]
    tasks: tuple[tuple[int, ...], ...]  # per task, indices into inputs
    version: int = VERSION  # of launcher.prepare's plan: an older plan was read and chosen otherwise

    def identity(self) -> dict[str, Any]:
        """What makes two preparations the same: everything but where it is written."""
        return {
            "version": self.version,
            "tokenizer": asdict(self.tokenizer),
            # the supervised fine-tuning keys only when set: a plain preparation keeps the identity it had
            # and --strict only when given
            "options": {k: v for k, v in asdict(self.options).items()
                        if (v is not None or k not in SFT_OPTIONS) and (v or k != "strict")},
            "inputs": [asdict(f) for f in self.inputs],
            "tasks": [list(t) for t in self.tasks],
        }

    @cached_property  # every task's record carries it: computed once per plan, not per task
    def fingerprint(self) -> str:
        payload = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(payload.encode()).hexdigest()

    def task_files(self, index: int) -> list[InputFile]:
        return [self.inputs[i] for i in self.tasks[index]]

    @property
    def parts(self) -> Path:
        return Path(self.out) / PARTS

    def to_json(self) -> dict[str, Any]:
        return {"out": self.out, "fingerprint": self.fingerprint, **self.identity()}

    @staticmethod
    def from_json(raw: dict[str, Any]) -> Plan:
        tok = raw["tokenizer"]
        return Plan(
            out=raw["out"],
            tokenizer=TokenizerChoice(
                TokenizerInfo(**tok["info"]), tok["eod_id"], tok["eod_token"], tok["eod_from"]
            ),
            options=Options.from_json(raw["options"]),
            inputs=tuple(InputFile(**f) for f in raw["inputs"]),
            tasks=tuple(tuple(t) for t in raw["tasks"]),
            version=raw.get("version", 1),
        )


def group_tasks(
    inputs: list[InputFile] | tuple[InputFile, ...], task_mb: float
) -> tuple[tuple[int, ...], ...]:
    """Consecutive files until a group reaches `task_mb` megabytes (a larger file is a task of its own)."""
    limit = task_mb * 2**20
    tasks: list[tuple[int, ...]] = []
    current: list[int] = []
    size = 0
    for index, file in enumerate(inputs):
        if current and size + file.bytes > limit:
            tasks.append(tuple(current))
            current, size = [], 0
        current.append(index)
        size += file.bytes
    if current:
        tasks.append(tuple(current))
    return tuple(tasks)


def make_plan(out: Path, tokenizer: TokenizerChoice, options: Options, inputs: list[InputFile]) -> Plan:
    return Plan(str(out.resolve()), tokenizer, options, tuple(inputs), group_tasks(inputs, options.task_mb))


def load_plan(out: Path) -> Plan | None:
    """The plan stored in `out`, or None when there is none (a damaged one counts as different)."""
    path = out / PARTS / PLAN
    try:
        return Plan.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{path} is damaged ({err}): prepare again with --overwrite") from None


def difference(old: Plan, new: Plan) -> str:
    """What differs between two plans, in words (the first difference that a user would recognise)."""
    if old.version != new.version:
        return f"it was prepared by an earlier launcher.prepare (plan version {old.version}, now {new.version})"
    if old.tokenizer != new.tokenizer:
        return f"it was prepared with the tokenizer {old.tokenizer.describe()}"
    for key, value in asdict(new.options).items():
        was, flag = getattr(old.options, key), "--" + key.replace("_", "-")
        if was != value and key == "chat_template":
            return "the tokenizer's chat template (its tokenizer_config.json) has changed since"
        if was != value:
            if isinstance(value, bool):
                return f"it was prepared {'with' if was else 'without'} {flag}"
            if isinstance(value, tuple) or value is None or was is None:
                return f"it was prepared with {_given(flag, was)}; this command has {_given(flag, value)}"
            return f"it was prepared with {flag} {was}, not {value}"
    old_files = {f.path: f for f in old.inputs}
    new_files = {f.path: f for f in new.inputs}
    for path in sorted(new_files.keys() - old_files.keys()):
        return f"other inputs ({path} is new)"
    for path in sorted(old_files.keys() - new_files.keys()):
        return f"other inputs ({path} is not among them now)"
    for path, file in new_files.items():
        if old_files[path].named != file.named:
            how = "named one by one" if file.named else "found in a directory or by a glob"
            return f"other inputs ({path} is {how} now)"
        if old_files[path] != file:
            return f"other inputs ({path} changed since)"
    return "a different plan"


def _given(flag: str, value: Any) -> str:
    """An option as a command line gives it: `--include '*.py' --include '*.md'`, or `no --include`."""
    import shlex

    values = value if isinstance(value, tuple) else () if value is None else (value,)
    return " ".join(f"{flag} {shlex.quote(str(v))}" for v in values) if values else f"no {flag}"
