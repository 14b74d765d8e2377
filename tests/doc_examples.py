"""The documentation's shell examples, read and run as the convention in mkdocs.yml's pages says (docs/testing.md):

    <!-- run -->            the next ```bash block runs in the local tier (tests/dist/test_doc_examples.py)
    <!-- run: slurm -->     it runs on the local cluster (tests/slurm/test_doc_examples.py)
    <!-- run: containers --> it runs in the containers tier, on `make containers-up`'s runtimes and test image
                            (tests/containers/test_container_docs.py)
    <!-- illustrative -->   it is not run (a GPU cluster, a user's own paths); a sentence says so
    <!-- output -->         the next ```text block lists lines the runnable block before it prints, in order;
                            `...` inside a line matches any text

A page's runnable blocks run in order in one bash (`set -euo pipefail`), so a block sees the files and the shell
variables of the blocks before it, in one fresh directory that holds nothing of the repository: a reader's own
project directory.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import ROOT, launcher_env

RUN, SLURM, ILLUSTRATIVE, OUTPUT = "run", "run: slurm", "illustrative", "output"
CONTAINERS = "run: containers"
MARKERS = {f"<!-- {m} -->": m for m in (RUN, SLURM, CONTAINERS, ILLUSTRATIVE, OUTPUT)}
# Fenced blocks a reader would type into a shell: each needs a marker.
SHELL_LANGUAGES = ("bash", "sh", "shell", "console", "zsh")
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
_SEPARATOR = "@@slurmtrain-doc-example-block@@"


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    language: str
    marker: str | None  # one of MARKERS' values, or None when the line before the fence is not a marker
    code: str
    expected: list[str] = field(default_factory=list)  # the <!-- output --> block's non-empty lines, if any

    @property
    def where(self) -> str:
        return f"{_shown(self.page)}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.marker in (RUN, SLURM, CONTAINERS)


def _shown(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)


def pages() -> list[Path]:
    """README.md and every page under docs/ (generated pages are never committed)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def read_blocks(page: Path) -> list[Block]:
    """Every fenced block of the page, with its marker; an output block is attached to the block before it (and
    also listed itself, so that lint can refuse one that follows no runnable block)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, language = match.groups()
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not (lines[i].strip().startswith(fence) and lines[i].strip(fence[0] + " ") == ""):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1  # the closing fence
        before = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        blocks.append(Block(page, start + 1, language.lower(), MARKERS.get(before), "\n".join(body) + "\n"))
    for previous, block in zip(blocks, blocks[1:], strict=False):
        if block.marker == OUTPUT:
            previous.expected = [line for line in block.code.splitlines() if line.strip()]
    return blocks


def lint(page: Path) -> list[str]:
    """What is wrong with the page's markers: an unexplained shell block, an output block after no runnable one, a
    runnable block that is not bash, a marker comment misspelt."""
    problems: list[str] = []
    blocks = read_blocks(page)
    for previous, block in zip([None, *blocks], blocks, strict=False):
        if block.marker is None and block.language in SHELL_LANGUAGES:
            problems.append(f"{block.where}: a ```{block.language} block with no marker: put `<!-- run -->` (or "
                            "`<!-- run: slurm -->`) on the line before it to have it tested, or `<!-- illustrative -->`"
                            " and a sentence saying why it cannot run here")
        if block.runnable and block.language != "bash":
            problems.append(f"{block.where}: a runnable block must be ```bash, not ```{block.language or '(none)'}")
        if block.marker == OUTPUT and (previous is None or not previous.runnable):
            problems.append(f"{block.where}: an <!-- output --> block must follow a runnable block directly")
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        text = line.strip()
        if re.fullmatch(r"<!--\s*(run\b.*|output\b.*|illustrative\b.*)-->", text) and text not in MARKERS:
            problems.append(f"{_shown(page)}:{number}: {text} is not a marker: use one of {', '.join(MARKERS)}")
    return problems


def _pattern(expected: str) -> re.Pattern[str]:
    return re.compile(".*?".join(re.escape(part) for part in expected.strip().split("...")))


def missing_lines(expected: list[str], output: str) -> list[str]:
    """The expected lines not found in `output` in order (each within one line of it); [] when all are there."""
    lines = output.splitlines()
    at = 0
    for n, want in enumerate(expected):
        pattern = _pattern(want)
        found = next((k for k in range(at, len(lines)) if pattern.search(lines[k])), None)
        if found is None:
            return expected[n:]
        at = found + 1
    return []


class ExampleFailed(AssertionError):
    pass


def _script(blocks: list[Block]) -> str:
    parts = ["set -euo pipefail"]
    for block in blocks:
        parts += [f"printf '\\n%s\\n' '{_SEPARATOR}'", block.code]
    return "\n".join(parts) + f"\nprintf '\\n%s\\n' '{_SEPARATOR}'\n"


def run_blocks(blocks: list[Block], workdir: Path | None = None, timeout: float = 600) -> list[str]:
    """Run the blocks in order in one bash, in `workdir` (a fresh temporary directory when None); raise
    ExampleFailed naming the block that failed, or whose output lacks a line its <!-- output --> block shows.
    Returns each block's output (standard output and error together)."""
    if not blocks:
        return []
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="slurmtrain-doc-") as tmp:
            return run_blocks(blocks, Path(tmp), timeout)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = launcher_env(PYTHONPATH=path, COLUMNS="120", TERM="dumb")
    try:
        done = subprocess.run(["bash", "-c", _script(blocks)], cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        output, code = done.stdout, done.returncode
    except subprocess.TimeoutExpired as err:
        out = err.stdout
        output = out.decode(errors="replace") if isinstance(out, bytes) else (out or "")
        code = None
    # A separator before each block and after the last: the chunks after the first are the blocks' outputs, and a
    # block ended (successfully) when a chunk follows its own.
    outputs = output.split(f"\n{_SEPARATOR}\n")[1:]
    for i, (block, text) in enumerate(zip(blocks, outputs, strict=False)):
        if i + 1 >= len(outputs):
            break
        missing = missing_lines(block.expected, text)
        if missing:
            raise ExampleFailed(f"{block.where}: the output lacks {missing[0]!r} (expected in order: "
                                f"{block.expected}); it printed:\n{_tail(text)}")
    if code != 0:
        failed = blocks[max(0, min(len(outputs), len(blocks)) - 1)]
        how = f"ran past {timeout:.0f} s" if code is None else f"exited {code}"
        raise ExampleFailed(f"{failed.where}: the example {how}:\n{failed.code}it printed:\n"
                            f"{_tail(outputs[-1] if outputs else output)}")
    return outputs[: len(blocks)]


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def runnable(page: Path, markers: tuple[str, ...]) -> list[Block]:
    return [b for b in read_blocks(page) if b.marker in markers]
