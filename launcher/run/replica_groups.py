"""Local replica groups (parallel.replica_groups with local.nproc): N groups of nproc/N ranks on this machine, each
its own torch.distributed world (its own store and port), one lighthouse for all (launcher/run/lighthouse.py).

A group whose rank fails is torn down whole at once (SIGKILL to every rank of it: a live rank 0 would keep the
group in the quorum and hold the others until the quorum timeout), and started again with HEAL_ENV set when another
group lives: it takes the state from a live group and reads no checkpoint. The other groups never stop. With no
group alive it starts from the newest checkpoint of any group (contract/rundir/replicas.py adopt_newest), as a
whole-run resume does; one lost once the others have finished the run takes a finished group's final checkpoint
and is not trained again (adopt_finished). A group is started again in the background (its ranks' start-up takes seconds: the zygote imports
torch), so that the launcher goes on watching the others meanwhile: a second group lost then is torn down at once
too, not once the first is up (its live rank 0 would hold the quorum, and a heal that comes after the live groups have
ended finds nobody to heal from). A stop (Ctrl-C, SIGUSR1, SIGTERM to the launcher) goes to every group, and they stop
together at one step. A group that a signal reached alone (a `kill` of its ranks) checkpoints, stops alone and exits
EXIT_LEFT (train/replicas/stops.py): it is started again as a lost group is, and heals (the local counterpart of its
SLURM task's requeue), within the same MAX_RESTARTS. Group k > 0 keeps its own run directory, RUN_DIR/replicas/group_k
(contract/rundir/replicas.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from omegaconf import OmegaConf

from contract.errors import EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_STOPPED
from contract.rundir import replicas as contract
from contract.rundir.events import record_event
from launcher.run import lighthouse, local_ends
from launcher.run.local import POLL_S, WorkerGroup

# Restarts of one group within a run before the launcher gives up on it (the others go on without it).
MAX_RESTARTS = 3
CLEAN = (0, EXIT_STOPPED, EXIT_DIVERGED)


def group_config(run_dir: Path, group: int) -> Path:
    """Group k's config.yaml: RUN_DIR's own for group 0, a copy in its run directory for the others."""
    config = Path(run_dir) / "config.yaml"
    if group == 0:
        return config
    own = contract.group_dir(run_dir, group)
    (own / "logs").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(config, own / "config.yaml")
    return own / "config.yaml"


class ReplicaGroups:
    def __init__(self, config_path: Path, nproc: int, groups: int, lighthouse_address: str) -> None:
        self.run_dir, self.nproc, self.groups = config_path.parent, nproc, groups
        self.per_group = nproc // groups
        self.address = lighthouse_address
        self.launch = f"{os.getpid()}-{int(time.time() * 1000)}"
        self.configs = [group_config(self.run_dir, g) for g in range(groups)]
        self.max_steps = int(OmegaConf.load(config_path).trainer.max_steps)
        self.workers: list[WorkerGroup] = []
        self.restarts = [0] * groups
        self.ended: dict[int, int] = {}
        self.stopping = False
        # Groups being started again, in the background: the thread, and the error it met (None: none yet).
        self.starting: dict[int, tuple[threading.Thread, list[BaseException]]] = {}

    def _make(self, group: int, heal: bool) -> WorkerGroup:
        env = {contract.GROUP_ENV: str(group), contract.GROUPS_ENV: str(self.groups),
               contract.LIGHTHOUSE_ENV: lighthouse.url(self.address), contract.LAUNCH_ENV: self.launch,
               contract.HEAL_ENV: "1" if heal else "0",
               # torchft's Rust side logs every quorum at info: warnings and errors only, unless asked for
               "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        return WorkerGroup(self.configs[group], self.per_group, env, terminal=group == 0)

    def start(self) -> None:
        self.workers = [self._make(g, heal=False) for g in range(self.groups)]
        for worker in self.workers:
            worker.start()

    def _restart(self, group: int, heal: bool) -> None:
        """Group `group` started again in a thread: poll() leaves it alone until its ranks are all up."""
        worker = self.workers[group] = self._make(group, heal)
        errors: list[BaseException] = []

        def start() -> None:
            try:
                worker.start()
            except BaseException as err:  # noqa: BLE001 - said by poll(), in the launcher's thread
                errors.append(err)

        thread = threading.Thread(target=start, name=f"replica-group-{group}-start", daemon=True)
        self.starting[group] = (thread, errors)
        thread.start()

    def _started(self, group: int) -> bool:
        """Whether the group's ranks are all up (a restart's thread done); one that failed to start has ended."""
        if group not in self.starting:
            return True
        thread, errors = self.starting[group]
        if thread.is_alive():
            return False
        del self.starting[group]
        if errors:
            print(f"launcher: replica group {group} could not be started again: {errors[0]}", file=sys.stderr,
                  flush=True)
            self.ended[group] = 1
            return False
        return True

    def on_interrupt(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
        for g, worker in enumerate(self.workers):
            worker.on_interrupt(signum, frame, say=g == 0)  # one line for all the groups

    def _alive(self, group: int) -> bool:
        """Running and up (a group still starting again is no peer to heal from)."""
        return group not in self.ended and group not in self.starting and any(
            p.poll() is None for p in self.workers[group].procs)

    def poll(self) -> bool:
        """One look at every group; True once every group has ended. Every group found lost is torn down before
        any is started again."""
        lost = []
        for g, worker in enumerate(self.workers):
            if g in self.ended or not self._started(g):
                continue
            codes = [p.poll() for p in worker.procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, *CLEAN, contract.EXIT_LEFT)]
            if failed:
                worker.signal_all(signal.SIGKILL)  # the whole group at once, before its rank 0 can hold the quorum
                lost.append((g, *failed[0]))
            elif all(c is not None for c in codes):
                ends = [int(c) for c in codes if c is not None]
                if contract.EXIT_LEFT in ends:
                    self._left(g)
                else:
                    self.ended[g] = next((c for c in ends if c != 0), 0)
        for g, _, _ in lost:
            for p in self.workers[g].procs:
                p.wait()
            self.workers[g].cleanup()
        for g, rank, code in lost:
            self._lost(g, rank, code, others_lost={h for h, _, _ in lost})
        return len(self.ended) == self.groups

    def _lost(self, group: int, rank: int, code: int, others_lost: set[int]) -> None:
        """Group `group` (torn down) was lost: started again, healing when a group outside `others_lost` lives."""
        worker = self.workers[group]
        reason = WorkerGroup.reason(code)
        others = any(self._alive(g) for g in range(self.groups) if g not in others_lost)
        finished = sorted(g for g, c in self.ended.items() if c == 0)
        if code != EXIT_BAD_INPUT and not others and finished:
            # Lost (or started to heal) once the other groups had finished the run: started again from its own
            # checkpoint it would train their steps again alone, into other weights (and the ledger would count them
            # as theirs, missed). It takes a finished group's final checkpoint instead and ends there.
            done = contract.adopt_finished(self.run_dir, group, self.groups, self.max_steps)
            print(f"launcher: replica group {group} lost (rank {rank} {reason}) after group(s) {finished} finished the "
                  f"run: it takes group {done}'s final checkpoint and is not trained again", file=sys.stderr,
                  flush=True)
            self.ended[group] = 0
            return
        if code == EXIT_BAD_INPUT or self.stopping or self.restarts[group] >= MAX_RESTARTS:
            print(f"launcher: replica group {group} ended (rank {rank} {reason}); not restarted; its log: "
                  f"{worker.log_paths[rank]}", file=sys.stderr, flush=True)
            self.ended[group] = code if code > 0 else 128 - code
            return
        self.restarts[group] += 1
        heal = others and code != contract.EXIT_NO_PEER
        # The group's attempt ends here (its rank 0 may have died without a word): what it cost is in the ledger
        # (contract/rundir/failure_cost.py). A group that heals trains none of its steps again.
        local_ends.record_end(worker.run_dir, worker.procs[0].pid, worker.started, "crashed",
                              error=f"rank {rank} {reason}", **({"steps_lost": 0} if heal else {}))
        how = "it heals from a live group"
        if not heal:  # the newest checkpoint of any group (another's when its own save of that step was cut short)
            newest = contract.adopt_newest(self.run_dir, group, self.groups)
            how = "from the newest checkpoint: no group is alive" + (
                "" if newest is None else f"; step {newest[1]}" + ("" if newest[0] == group else
                                                                   f", group {newest[0]}'s"))
        print(f"launcher: replica group {group} lost (rank {rank} {reason}); torn down and restarted ({how}); "
              f"the other groups go on", file=sys.stderr, flush=True)
        self._note_restart(group)
        self._restart(group, heal)

    def _left(self, group: int) -> None:
        """Every rank of the group exited after it stopped alone, its checkpoint and its end recorded: started
        again to heal while another group trains; otherwise it ends as a stop."""
        self.workers[group].cleanup()
        others = any(self._alive(g) for g in range(self.groups) if g != group)
        if self.stopping or not others or self.restarts[group] >= MAX_RESTARTS:
            why = ("the launcher is stopping" if self.stopping else "no other group trains" if not others
                   else f"it was started again {MAX_RESTARTS} times")
            print(f"launcher: replica group {group} stopped alone with a checkpoint; not started again ({why})",
                  file=sys.stderr, flush=True)
            finished = not self.stopping and not others and 0 in self.ended.values()
            if finished:  # the run's end is the finished groups': this group's directory gets their checkpoint
                contract.adopt_finished(self.run_dir, group, self.groups, self.max_steps)
            self.ended[group] = 0 if finished else EXIT_STOPPED
            return
        self.restarts[group] += 1
        print(f"launcher: replica group {group} stopped alone with a checkpoint (a signal reached only it); started "
              "again: it heals from a live group; the other groups go on", file=sys.stderr, flush=True)
        self._note_restart(group)
        self._restart(group, heal=True)

    def _note_restart(self, group: int) -> None:
        """Until the new attempt starts, launcher.status reads the group as running while this launcher lives
        (contract/rundir/replicas.py restarting), not as the end it just recorded."""
        try:
            record_event(self.workers[group].run_dir, contract.RESTARTING, group=group, launcher_pid=os.getpid(),
                         host=socket.gethostname())
        except OSError:
            pass  # a run directory that takes no write: the launcher's line is all there is

    def stop(self) -> None:
        for thread, _ in list(self.starting.values()):
            thread.join()  # its ranks up (a stop asked meanwhile reached them as they started: WorkerGroup.start)
        self.starting.clear()
        for g, worker in enumerate(self.workers):
            if self._alive(g):
                worker.stop()
            worker.cleanup()

    def exit_code(self) -> int:
        codes = [self.ended.get(g, 1) for g in range(self.groups)]
        failed = [c for c in codes if c not in CLEAN]
        if failed:
            return failed[0]
        if EXIT_DIVERGED in codes:
            return EXIT_DIVERGED
        if EXIT_STOPPED in codes:
            print(f"launcher: replica groups checkpointed and stopped; run the same command to resume (run directory "
                  f"{self.run_dir})", file=sys.stderr)
            return EXIT_STOPPED
        return 0


def run_replica_groups(config_path: Path, nproc: int, parallel: Any) -> int:
    groups = int(parallel.replica_groups)
    beacon = lighthouse.start(parallel, config_path.parent)
    print(f"launcher: lighthouse at {beacon.address} ({config_path.parent / contract.LIGHTHOUSE_FILE})",
          file=sys.stderr, flush=True)
    runner = ReplicaGroups(config_path, nproc, groups, beacon.address)
    handled = (signal.SIGINT, signal.SIGUSR1, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, runner.on_interrupt) for sig in handled}
    try:
        runner.start()
        print(f"launcher: started {groups} replica groups of {nproc // groups} worker(s); logs in "
              f"{config_path.parent / 'logs'} and {config_path.parent / 'replicas'}/group_*/logs", file=sys.stderr,
              flush=True)
        while not runner.poll():
            if not beacon.alive():  # ours died: started again at its address, the groups' quorums reach it anew
                print(f"launcher: the lighthouse at {beacon.address} died; starting it again there", file=sys.stderr,
                      flush=True)
                beacon = lighthouse.start(parallel, config_path.parent, address=beacon.address)
            time.sleep(POLL_S)
        return runner.exit_code()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        runner.stop()
        beacon.stop()
