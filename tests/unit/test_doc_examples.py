"""The documentation's examples convention (tests/doc_examples.py): every shell block in README.md and docs/ is
marked runnable or illustrative, every link of the README resolves, and the runner fails on a broken example."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from launcher.docs.site import generated_paths
from tests import doc_examples as d
from tests.conftest import ROOT


@pytest.mark.parametrize("page", d.pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shell_block_is_marked(page: Path) -> None:
    assert d.lint(page) == []


def test_readme_links_resolve() -> None:
    """Every relative link of the README names a file of the repository (the reference pages are committed) or a
    figure the site's build generates (docs/generated/loss.png: launcher/docs/site.py)."""
    text = (ROOT / "README.md").read_text()
    links = [t.split("#", 1)[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:|#", t)]
    generated = {f"docs/{path}" for path in generated_paths()}
    missing = [t for t in links if not (ROOT / t).exists() and t not in generated]
    assert missing == []


def _page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text)
    return page


PAGE = """# A page

<!-- run -->
```bash
mkdir data && echo "hello world" > data/a.txt
greeting=hi
```

Then:

<!-- run -->
```bash
cat data/a.txt > /dev/null
echo "$greeting: $(cat data/a.txt) at step 30 of 40"
pwd
```

<!-- output -->
```text
hi: hello ... step 30 of ...
```

On a GPU cluster:

<!-- illustrative -->
```bash
python -m launcher +cluster=h100x64
```
"""


def test_a_page_runs_in_order_in_one_shell_and_fresh_directory(tmp_path: Path) -> None:
    page = _page(tmp_path, PAGE)
    assert d.lint(page) == []
    blocks = d.runnable(page, (d.RUN,))
    assert [b.line for b in blocks] == [4, 12]
    assert blocks[1].expected == ["hi: hello ... step 30 of ..."]
    outputs = d.run_blocks(blocks)
    assert "hi: hello world at step 30 of 40" in outputs[1]
    assert str(ROOT) not in outputs[1]  # the reader's own directory, not the repository


@pytest.mark.parametrize(("broken", "says"), [
    (PAGE.replace("cat data/a.txt >", "cat data/b.txt >"), "page.md:12: the example exited 1"),
    (PAGE.replace("hi: hello ... step 30", "hi: hello ... step 31"), "page.md:12: the output lacks"),
    (PAGE.replace("greeting=hi", "greeting=hi; false"), "page.md:4: the example exited 1"),
    (PAGE.replace('echo "$greeting', 'echo "$greting'), "unbound variable"),
], ids=["command-fails", "output-differs", "earlier-block-fails", "unset-variable"])
def test_a_broken_example_fails(tmp_path: Path, broken: str, says: str) -> None:
    with pytest.raises(d.ExampleFailed, match=re.escape(says)):
        d.run_blocks(d.runnable(_page(tmp_path, broken), (d.RUN,)))


@pytest.mark.parametrize(("text", "says"), [
    ("```bash\necho hi\n```\n", "a ```bash block with no marker"),
    ("```console\n$ echo hi\n```\n", "a ```console block with no marker"),
    ("<!-- run -->\n```python\nprint(1)\n```\n", "a runnable block must be ```bash"),
    ("<!-- illustrative -->\n```bash\necho\n```\n<!-- output -->\n```text\nx\n```\n", "must follow a runnable"),
    ("<!-- run:slurm -->\n```bash\necho\n```\n", "<!-- run:slurm --> is not a marker"),
], ids=["bash", "console", "not-bash", "stray-output", "misspelt"])
def test_lint_names_what_is_wrong(tmp_path: Path, text: str, says: str) -> None:
    problems = d.lint(_page(tmp_path, text))
    assert any(says in p for p in problems), problems


def test_expected_lines_match_in_order() -> None:
    out = "plan: local, world size 2\nstep 10 loss 4.1\nfinished at step 30 (30720 tokens)\n"
    assert d.missing_lines(["plan: local, world size ...", "finished at step 30 (... tokens)"], out) == []
    assert d.missing_lines(["finished at step 30", "plan: local"], out) == ["plan: local"]
    assert d.missing_lines(["step ... loss 9"], out) == ["step ... loss 9"]


def test_the_readme_tour_is_tested() -> None:
    """The README's tour runs as written: locally and on the cluster (so the dist and slurm tiers have pages)."""
    readme = ROOT / "README.md"
    assert d.runnable(readme, (d.RUN,)) and d.runnable(readme, (d.SLURM,))
