"""docs/containers.md's examples, run whole as a reader types them (tests/doc_examples.py): its `<!-- run: containers
-->` blocks need the runtimes and the test image of `make containers-up`, and the local cluster with pyxis."""

from __future__ import annotations

from tests import doc_examples as d
from tests.conftest import ROOT
from tests.containers.conftest import need_runtime

PAGE = ROOT / "docs" / "containers.md"


def test_containers_page_examples_run() -> None:
    for runtime in ("charliecloud", "pyxis", "enroot", "podman"):
        need_runtime(runtime)
    blocks = d.runnable(PAGE, (d.RUN, d.SLURM, d.CONTAINERS))
    assert len(blocks) >= 4
    d.run_blocks(blocks, timeout=900)


def test_no_other_tier_runs_the_page() -> None:
    assert not d.runnable(PAGE, (d.RUN,)) and not d.runnable(PAGE, (d.SLURM,))
    assert d.lint(PAGE) == []
