"""torchft's report of a peer group lost mid-all-reduce (train/replicas/manager.py _PeerLossLine): one warning line,
no traceback, on the survivors; any other torchft record passes unchanged."""

from __future__ import annotations

import logging

import pytest

from train.replicas.manager import quiet_peer_losses


def test_a_peer_lost_mid_all_reduce_is_one_warning_line(caplog: pytest.LogCaptureFixture) -> None:
    quiet_peer_losses()
    quiet_peer_losses()  # once, however often a process makes a Manager
    logger = logging.getLogger("torchft.manager")
    assert sum(type(f).__name__ == "_PeerLossLine" for f in logger.filters) == 1
    with caplog.at_level(logging.INFO, logger="torchft.manager"):
        try:
            raise RuntimeError("Connection closed by peer [127.0.0.1]:4242\nmore detail")
        except RuntimeError as err:
            logger.exception(f"[group_0:abc/0 - step 16] got exception waiting for work {err}")
        logger.info("[group_0:abc/0 - step 17] reconfiguring for quorum_id=3")
    lost, other = caplog.records
    assert lost.levelno == logging.WARNING and lost.exc_info is None and "Traceback" not in caplog.text
    assert lost.getMessage() == (
        "[group_0:abc/0 - step 16] a peer group was lost during this step's cross-group all-reduce (Connection closed "
        "by peer [127.0.0.1]:4242): the step is discarded and trained again")
    assert other.levelno == logging.INFO and other.getMessage().endswith("reconfiguring for quorum_id=3")
