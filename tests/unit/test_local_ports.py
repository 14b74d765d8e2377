"""Local ranks meet at a port the launcher binds and holds (launcher/run/local.py): rank 0 hosts the TCPStore on
the launcher's listening socket, so no port is picked ahead, released, and bound again (another process could take
it in between: EADDRINUSE)."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from launcher.run import local, rank_fork
from train import distributed


class _Proc:
    pid = 1

    def poll(self) -> int:
        return 0


def test_rank_0_gets_the_listening_socket_the_launcher_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[dict[str, Any]] = []

    def popen(cmd: list[str], env: dict[str, str], pass_fds: tuple[int, ...] = (), **kwargs: Any) -> _Proc:
        started.append({"env": env, "pass_fds": pass_fds})
        return _Proc()

    monkeypatch.setattr(local.subprocess, "Popen", popen)
    monkeypatch.setenv(rank_fork.FORK_ENV, "0")  # each rank a process of its own (forked ranks: test_rank_fork.py)
    (tmp_path / "logs").mkdir()
    (tmp_path / "config.yaml").write_text("container:\n  runtime: none\n")  # the group reads its container section
    group = local.WorkerGroup(tmp_path / "config.yaml", 2)
    group.start()
    try:
        ports = {s["env"]["MASTER_PORT"] for s in started}
        assert len(ports) == 1
        port = int(ports.pop())
        fd = int(started[0]["env"][distributed.STORE_FD_ENV])
        assert local.STORE_FD_ENV == distributed.STORE_FD_ENV
        assert started[0]["pass_fds"] == (fd,) and started[1]["pass_fds"] == ()
        assert distributed.STORE_FD_ENV not in started[1]["env"]
        held = socket.socket(fileno=os.dup(fd))
        try:
            assert held.getsockname()[1] == port
            assert held.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1  # listening: ranks can connect
        finally:
            held.close()
        with socket.socket() as other, pytest.raises(OSError) as taken:
            other.bind(("127.0.0.1", port))  # nobody else can take the port while the workers start
        assert taken.value.errno == errno.EADDRINUSE
    finally:
        group.cleanup()
    assert group.store_socket is not None and group.store_socket.fileno() == -1  # released when the workers end


def test_only_rank_0_of_a_local_run_hosts_and_a_hosted_store_makes_every_rank_a_client(
        monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []

    def store(*args: Any, **kwargs: Any) -> dict[str, Any]:
        made.append({"args": args, **kwargs})
        return made[-1]

    monkeypatch.setattr(distributed.dist, "TCPStore", store)

    def env(rank: int) -> distributed.DistEnv:
        return distributed.DistEnv(rank, rank, 2, 2, "127.0.0.1", 4242, "local", "n")

    distributed.rendezvous_store(env(0), 60, {distributed.STORE_FD_ENV: "7"})
    distributed.rendezvous_store(env(1), 60, {})
    distributed.rendezvous_store(env(0), 60, {distributed.AGENT_STORE_ENV: "True"})
    distributed.rendezvous_store(env(0), 60, {})  # SLURM: rank 0 binds the job's port as it creates the store
    assert [(m["is_master"], m.get("master_listen_fd")) for m in made] == [(True, 7), (False, None), (False, None),
                                                                          (True, None)]
    assert all(m["args"][:3] == ("127.0.0.1", 4242, 2) for m in made)
