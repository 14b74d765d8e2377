"""The pages with `<!-- run: slurm -->` examples, run whole on the local cluster: their `<!-- run -->` and
`<!-- run: slurm -->` blocks in order, as a reader would type them (tests/doc_examples.py), with the lines their
`<!-- output -->` blocks show. The other pages run in the local tier (tests/dist/test_doc_examples.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests import doc_examples as d
from tests.conftest import ROOT
from tests.slurm.remote_helpers import SSHD_DIR, require_login_node

pytestmark = pytest.mark.slurm

SLURM_PAGES = [p for p in d.pages() if d.runnable(p, (d.SLURM,))]


@pytest.mark.parametrize("page", SLURM_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_run_on_the_cluster(page: Path) -> None:
    if page.name == "remote.md":  # through the local login node too (make sshd-up)
        require_login_node()
        # The page's run lives on the test login node, which outlives a suite: a copy left by an earlier tree (other
        # settings) would be refused as a different run, as it would be for a user.
        shutil.rmtree(SSHD_DIR / "work" / "outputs" / "from_laptop", ignore_errors=True)
    d.run_blocks(d.runnable(page, (d.RUN, d.SLURM)), timeout=900)
