"""The start barrier of a fresh replica-group run (train/replicas/manager.py start_barrier): a group says it is there
(its ready file) only once the lighthouse hears its heartbeat. Before, the file came with the Manager's construction
and its first heartbeat a moment later: on a loaded host a group passed the barrier, asked for its first quorum while
the lighthouse heard only itself, and trained step 1 without the other group, which then healed at once (the run no
longer equal to a plain one, seen in tests/dist/test_replica_groups.py's stop-and-resume test)."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

from contract.rundir import replicas as contract
from train.replicas.manager import start_barrier


def test_a_group_is_ready_only_once_the_lighthouse_hears_it(tmp_path: Path) -> None:
    ready = contract.ready_file(tmp_path, "local", 1)
    seen: list[bool] = []  # per ask of the lighthouse: whether the ready file already existed

    class Status(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            seen.append(ready.exists())
            heard = '<li class="heartbeat">group_1:1f0c</li>' if len(seen) >= 4 else ""
            self.send_response(200)
            self.end_headers()
            self.wfile.write(f'<ul><li class="heartbeat">group_0:9a2b</li>{heard}</ul>'.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Status)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    contract.ready_file(tmp_path, "local", 0).parent.mkdir(parents=True)
    contract.ready_file(tmp_path, "local", 0).touch()  # group 0 is there already
    try:
        start_barrier(tmp_path, "local", 1, 2, 30.0, True, f"127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
    assert len(seen) == 4 and not any(seen), seen  # asked until heard, the file not there meanwhile
    assert ready.exists()


def test_without_a_lighthouse_to_ask_it_is_ready_at_once(tmp_path: Path) -> None:
    start_barrier(tmp_path, "local", 0, 1, 5.0, True, None)
    assert contract.ready_file(tmp_path, "local", 0).exists()
