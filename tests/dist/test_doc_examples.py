"""Every page's `<!-- run -->` examples, run in order as a reader would type them (tests/doc_examples.py), with the
lines their `<!-- output -->` blocks show. A page that also has `<!-- run: slurm -->` blocks runs whole in the slurm
tier instead (tests/slurm/test_doc_examples.py): its cluster blocks may read what its local ones made, and each
block runs once in the suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import doc_examples as d
from tests.conftest import ROOT

pytestmark = pytest.mark.dist

LOCAL_PAGES = [p for p in d.pages() if d.runnable(p, (d.RUN,)) and not d.runnable(p, (d.SLURM,))]


@pytest.mark.parametrize("page", LOCAL_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_run(page: Path) -> None:
    d.run_blocks(d.runnable(page, (d.RUN,)))
