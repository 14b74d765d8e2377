"""A replica group's lighthouse gone for good (train/replicas/peers.py lighthouse_gone): one that answers is not; one
whose own job has left SLURM's queue is, at once; one that stays silent is, after the wait. The ending is the
environment's (contract/rundir/environment.py): one line, never requeued."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from pathlib import Path

import pytest

from contract.rundir import replicas as contract
from contract.rundir.environment import LIGHTHOUSE_GONE, classify
from train.replicas import peers


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write(run_dir: Path, address: str, job: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if job:
        monkeypatch.setenv("SLURM_JOB_ID", job)
    else:
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    contract.write_lighthouse(run_dir, address, "host", 1, "job" if job else "login")


def test_a_lighthouse_that_answers_is_not_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Status(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"<html></html>")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Status)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _write(tmp_path, f"127.0.0.1:{server.server_address[1]}", "12345", monkeypatch)
        assert peers.lighthouse_gone(tmp_path, wait_s=0.0) == 0
    finally:
        server.shutdown()


def test_one_whose_job_left_the_queue_is_gone_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, f"127.0.0.1:{_closed_port()}", "4242", monkeypatch)
    monkeypatch.setattr(peers, "queue_state", lambda job: "" if job == "4242" else "RUNNING")
    began = time.monotonic()
    assert peers.lighthouse_gone(tmp_path, wait_s=60.0) == peers.JOB_ENDED
    assert time.monotonic() - began < 30  # not the wait: the job's end says it all
    err = peers.lighthouse_gone_error(tmp_path, 0, peers.JOB_ENDED)
    ending = classify(RuntimeError("quorum timed out").with_traceback(None), tmp_path)
    assert ending is None  # an ordinary failure is not the environment's
    wrapped = RuntimeError("the step failed")
    wrapped.__cause__ = err
    ending = classify(wrapped, tmp_path)
    assert ending is not None and ending.cause == LIGHTHOUSE_GONE
    assert "is gone (its job 4242 has ended)" in ending.line and "replica group 0 ends here, not requeued" in ending.line
    assert "run the same command: no checkpoint was complete yet" in ending.line and "\n" not in ending.line


def test_one_still_queued_but_silent_is_gone_after_the_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, f"127.0.0.1:{_closed_port()}", "4243", monkeypatch)
    monkeypatch.setattr(peers, "queue_state", lambda job: "RUNNING")  # its keeper may be starting it again
    began = time.monotonic()
    assert peers.lighthouse_gone(tmp_path, wait_s=3.0) == peers.SILENT
    assert time.monotonic() - began >= 3.0
    assert "it has not answered for 60 s" in peers.lighthouse_gone_error(tmp_path, 0, peers.SILENT).ending.line
