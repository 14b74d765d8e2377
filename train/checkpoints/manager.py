"""Save, load, resume and retention: the only code that touches checkpoint files (layout: ckpt_layout.py).

Model and optimizer go through torch.distributed.checkpoint (DCP) with the FQN-keyed state dicts of
torch.distributed.checkpoint.state_dict, so a checkpoint written by N ranks loads on M ranks. Periodic saves are
asynchronous (DCP async_save on a gloo group of their own, at most one in flight); the save on preemption and at
the end is synchronous. Rank 0 writes the COMPLETE marker only once the DCP save has finished on every rank.

An asynchronous save blocks training for as little as it can: the copy of the state into the staging buffers (the
bulk of a save's time on the training thread) runs in a background thread too, overlapping the next step's
forward and backward, which only read the parameters. The loop calls `ready_for_update()` before the optimizer
step, the first thing that writes them, and waits there if the copy is not finished. `stalls` counts what
training waited, in save(), there and when finishing a save.
"""

from __future__ import annotations

import json
import os
import signal
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from omegaconf import OmegaConf
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from contract.rules.eval_jobs import evaluated_step, jobs_enabled
from contract.rundir import ckpt_layout as layout
from contract.rundir import eval_results
from train.checkpoints import manifest as manifest
from train.checkpoints.retention import _submit_evaluation, apply_retention
from train.checkpoints.state import (
    ModelOptimState,
    _serialized,
    _write_files,
    refuse_fused_layout,
    rng_state,
    set_rng_state,
)
from train.distributed import DistEnv
from train.observe.metrics import log

# One process without a process group is a legitimate single-rank save, not a mistake worth a warning.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

# Fault injection for tests: "STEP" makes rank 0 SIGKILL itself after writing that step's shards, before its marker.
TEST_KILL_ENV = "SLURMTRAIN_TEST_KILL_BEFORE_MARKER"
# How long rank 0 waits for the other ranks' manifest pieces (their hashing runs in parallel with its own).
MANIFEST_TIMEOUT_S = 600


class CheckpointManager:
    def __init__(self, cfg: Any, env: DistEnv, run_dir: Path, strategy: Any) -> None:
        self.cfg, self.env, self.run_dir, self.strategy = cfg, env, Path(run_dir), strategy
        # Async saves run collectives from a background thread: they get a gloo group of their own so they never
        # interleave with the training collectives on the default group (which may be NCCL).
        self.group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self.pending: tuple[int, Future[Any], Path] | None = None
        # The in-flight save's copy into the staging buffers: the parameters and optimizer state must not change
        # before it completes (ready_for_update).
        self.staging: Future[Any] | None = None
        self.last_saved_step = -1
        # One stager for the whole run: it keeps its CPU staging buffers (pinned on CUDA), so only the first async
        # save pays for allocating them; later ones are a plain copy, made by the stager's own thread.
        self.stager: DefaultStager | None = None
        # Small files of async saves and retention's deletions, off the training thread, in order.
        self.io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="slurmtrain-ckpt-io")
        self._config_yaml = OmegaConf.to_yaml(cfg, resolve=True).encode()  # the same for every save of the run
        # Seconds training waited on checkpointing, by where: the save call, the staging copy before an optimizer
        # step, finishing a save that a later step found written (marker, retention).
        self.stalls = {"save": 0.0, "staging": 0.0, "finish": 0.0}
        # The fingerprint of the data this run reads (contract/data/fingerprint.py), in every COMPLETE marker so that
        # the launcher can refuse to resume it on other data; None: not token data.
        self.data_fingerprint: dict[str, Any] | None = None
        # eval.async_jobs: rank 0 submits an evaluation job per evaluated checkpoint (contract/rules/eval_jobs.py).
        self.submits_evaluations = env.is_main and cfg.get("cluster") is not None and jobs_enabled(cfg)
        # Whether the replicas agreed at a step (train/stability/replicas.py): each COMPLETE marker records it.
        self.verified: Callable[[int], bool] = lambda step: False
        # The losses at a step (train/stability: the step's and the run's best so far), for each COMPLETE marker.
        self.losses_at: Callable[[int], dict[str, Any]] = lambda step: {}
        # More of the trainer state from the loop's parts that keep some (train/stability: what its decisions
        # depend on), called by rank 0 at each save; `loaded`: the trainer state of the checkpoint loaded last.
        self.extra_state: Callable[[], dict[str, Any]] = dict
        self.loaded: dict[str, Any] = {}

    # -- saving --------------------------------------------------------------------------------------------
    def save(self, state: Any, *, blocking: bool) -> None:
        start = time.perf_counter()
        try:
            self._save(state, blocking=blocking)
        finally:
            self.stalls["save"] += time.perf_counter() - start

    def _save(self, state: Any, *, blocking: bool) -> None:
        if state.step == self.last_saved_step:
            self.wait()
            return
        self.wait()  # at most one save in flight
        path = layout.step_dir(self.run_dir, state.step)
        if self.env.is_main:
            if path.exists():  # left over from an interrupted attempt at this very step
                layout.remove(layout.CheckpointDir(state.step, path))
            # Not parents=True: a run directory that vanished must fail the save, not be made anew, empty.
            layout.checkpoints_root(self.run_dir).mkdir(exist_ok=True)
            path.mkdir()
        self._barrier()
        layout.checkpoints_root(self.run_dir).mkdir(exist_ok=True)  # a shared filesystem may not show them yet
        path.mkdir(exist_ok=True)
        files = self._small_files(state, path)  # their contents now; an async save writes them in the background
        in_background = not blocking and self.cfg.checkpoint.async_save and self.strategy.checkpoint_format == "dcp"
        written = self.io.submit(_write_files, files) if in_background else None
        if written is None:
            _write_files(files)
        self.last_saved_step = state.step
        if self.strategy.checkpoint_format == "deepspeed":
            # DeepSpeed's own (collective, synchronous) save of its partitioned model and optimizer state.
            self.strategy.model.save_checkpoint(str(path), tag="model_optim", save_latest=False)
            manifest.write_piece(path, self.env.rank)
            self._barrier()  # every rank's partition is on disk before rank 0 marks the checkpoint complete
            self._complete(state.step, path)
            return
        target = {"app": ModelOptimState(self.strategy.model, self.strategy.optimizer), **self._beside()}
        if blocking or not self.cfg.checkpoint.async_save:
            dcp.save(target, checkpoint_id=path / "model_optim", process_group=self.group)
            manifest.write_piece(path, self.env.rank)
            self._complete(state.step, path)
        else:
            self.prepare_async()
            response = dcp.async_save(target, checkpoint_id=path / "model_optim", process_group=self.group,
                                      async_stager=self.stager)
            if isinstance(response, Future):  # no stager (no optimizer state yet): staged synchronously
                future = response
            else:
                self.staging, future = response.staging_completion, response.upload_completion
            rank = self.env.rank
            finished: Future[None] = Future()

            def hash_own_files(done: Future[Any], step_path: Path = path) -> None:
                try:
                    done.result()
                    assert written is not None
                    written.result()  # the RNG and trainer state files, before the piece that lists them
                    manifest.write_piece(step_path, rank)
                except BaseException as err:  # noqa: BLE001 - handed to wait(), raised on the training thread
                    finished.set_exception(err)
                else:
                    finished.set_result(None)

            # Hash this rank's files in the background once they are written (checksumming the shards takes about
            # as long as writing them); the save counts as done once its piece is there, and rank 0 finishes it
            # (the marker) once every rank's piece is (poll).
            future.add_done_callback(hash_own_files)  # type: ignore[union-attr]
            self.pending = (state.step, finished, path)

    def _beside(self) -> dict[str, Any]:
        """Stateful parts saved in the DCP checkpoint beside the model and optimizer: optim.outer=diloco's global
        weights and outer momentum (train/replicas/diloco.py)."""
        return dict(getattr(self.strategy.replicas, "checkpointed", None) or {})

    def _small_files(self, state: Any, path: Path) -> dict[Path, bytes]:
        """This rank's RNG state; on rank 0 the trainer state, the config (and DeepSpeed's config)."""
        files = {path / f"rng_rank{self.env.rank}.pt": _serialized(rng_state())}
        compression = self.strategy.compression.state_dict() if self.strategy.compression is not None else None
        if compression is not None:  # PowerSGD's error feedback, this rank's own (strategies/grad_compression.py)
            files[path / f"gradcomm_rank{self.env.rank}.pt"] = _serialized(compression)
        if self.env.is_main:
            trainer_state = {**asdict(state), "scheduler": self.strategy.scheduler.state_dict(),
                             "scaler": self.strategy.scaler_state_dict(), "world_size": self.env.world_size,
                             **self.extra_state()}
            files[path / "trainer_state.pt"] = _serialized(trainer_state)
            files[path / "config.yaml"] = self._config_yaml
            ds_config = getattr(self.strategy, "ds_config", None)
            if ds_config is not None:
                files[path / "ds_config.json"] = (json.dumps(ds_config, indent=2) + "\n").encode()
        return files

    def prepare_async(self) -> None:
        """Allocate the staging buffers now (one CPU copy of this rank's state), not during the first save.

        The strategy created the optimizer state at set-up (strategies.base.init_optimizer_state), so reading
        the state dict here changes nothing; without that state, this waits for a later call.
        """
        if self.stager is None and self.strategy.checkpoint_format == "dcp" and self.strategy.optimizer.state:
            cuda = torch.cuda.is_available() and self.strategy.device.type == "cuda"
            self.stager = DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                                       use_async_staging=True, use_non_blocking_copy=cuda))
            staged = self.stager.stage(ModelOptimState(self.strategy.model, self.strategy.optimizer).state_dict())
            if isinstance(staged, Future):
                staged.result()

    def ready_for_update(self) -> None:
        """Before anything writes the parameters or optimizer state: the in-flight save's copy must be done."""
        if self.staging is not None:
            start = time.perf_counter()
            try:
                self.staging.result()
            finally:
                self.staging = None
                self.stalls["staging"] += time.perf_counter() - start

    def poll(self) -> None:
        """Non-blocking: finish the in-flight save if its files are all written."""
        if self.pending is not None and self.pending[1].done() and self._pieces_written(self.pending[2]):
            start = time.perf_counter()
            self.wait()  # the marker and retention, on the training thread
            self.stalls["finish"] += time.perf_counter() - start

    def _pieces_written(self, path: Path) -> bool:
        """Rank 0 finishes a save once every rank has written its manifest piece (the others: at once)."""
        return not self.env.is_main or not manifest.missing_pieces(path, self.env.world_size)

    @property
    def stall_s(self) -> float:
        return sum(self.stalls.values())

    def wait(self) -> None:
        if self.pending is None:
            return
        step, future, path = self.pending
        self.pending = None
        try:
            future.result()
        finally:
            self.staging = None  # the upload follows the copy: the copy is done (or failed with it)
        self._complete(step, path)

    def _complete(self, step: int, path: Path) -> None:
        # DCP's save ends with the coordinator (rank 0) gathering every rank's write results, so once it returns
        # on rank 0 all shards are on disk; the RNG files were written before the save started.
        if not self.env.is_main:
            return
        missing = manifest.wait_for_pieces(path, self.env.world_size, MANIFEST_TIMEOUT_S)
        if missing:
            log.error("checkpoint step %d left incomplete: ranks %s wrote no manifest within %d s", step, missing,
                      MANIFEST_TIMEOUT_S)
            return
        if os.environ.get(TEST_KILL_ENV) == str(step):
            # Fault injection for tests: die the hard way at the worst moment, shards written, marker not yet.
            os.kill(os.getpid(), signal.SIGKILL)
        data: dict[str, Any] = {} if self.data_fingerprint is None else {"data": self.data_fingerprint}
        data.update(self.losses_at(step))
        layout.write_marker(path, step=step, world_size=self.env.world_size, verified=self.verified(step), **data)
        log.info("checkpoint step %d complete: %s", step, path)
        if (self.submits_evaluations and evaluated_step(self.cfg, step)
                and eval_results.mark_pending(self.run_dir, step)):  # before retention looks
            self.io.submit(_submit_evaluation, self.cfg, self.run_dir, step)
        # Deleting gigabytes takes a while, and keep_best reads the run's measurements: in the background.
        self.io.submit(apply_retention, self.run_dir, self.cfg.checkpoint)

    def close(self) -> None:
        """Finish any save in flight, and the file writes and deletions behind it; free the staging buffers."""
        self.wait()
        self.io.submit(lambda: None).result()  # one worker, first in first out: everything before is done
        if self.stager is not None:
            self.stager.close()
            self.stager = None

    def _barrier(self) -> None:
        if self.group is not None:
            dist.barrier(group=self.group)

    # -- resuming ------------------------------------------------------------------------------------------
    def latest(self, where: Callable[[int], bool] | None = None) -> layout.CheckpointDir | None:
        """Rank 0 decides (and reports incomplete ones); every rank gets the same answer. `where`: only checkpoints
        whose step satisfies it (a rollback's, train/stability/rollback.py)."""
        choice: list[Any] = [None]
        if self.env.is_main:
            for c in layout.incomplete_checkpoints(self.run_dir):
                log.warning("ignoring incomplete checkpoint %s (no %s marker: interrupted while saving)",
                            c.path, layout.MARKER)
            latest, damaged = self._newest_trusted(where)
            # Every complete checkpoint damaged (and moved aside) on a resume: the run started over from step 0
            # in silence, its plan having said it resumes. Said instead, on every rank.
            gone = latest is None and where is None and damaged > 0
            choice = ["damaged" if gone else None if latest is None else latest.step]
        if self.group is not None:
            dist.broadcast_object_list(choice, src=0, group=self.group)
        if choice[0] == "damaged":
            from contract.errors import ConfigError

            raise ConfigError(f"every complete checkpoint of {self.run_dir} is damaged (each was moved to "
                              f"{layout.checkpoints_root(self.run_dir) / manifest.QUARANTINE_DIR}): nothing to resume "
                              "from: restore one there, or start over with run.resume=false run.overwrite=true")
        if choice[0] is None:
            return None
        return layout.CheckpointDir(choice[0], layout.step_dir(self.run_dir, choice[0]))

    def _newest_trusted(self, where: Callable[[int], bool] | None = None) -> tuple[layout.CheckpointDir | None, int]:
        """The newest complete checkpoint that passes verification, and how many newer ones failed it (moved
        aside, never deleted)."""
        full = self.cfg.checkpoint.verify == "full"
        damaged = 0
        for candidate in reversed([c for c in layout.list_checkpoints(self.run_dir)
                                   if c.complete and (where is None or where(c.step))]):
            problem = manifest.verify(candidate.path, full)
            if problem is None:
                return candidate, damaged
            damaged += 1
            moved = manifest.quarantine(candidate.path)
            log.error("checkpoint step %d is damaged (%s): moved to %s; resuming from the previous complete one",
                      candidate.step, problem, moved)
        return None, damaged

    def load(self, checkpoint: layout.CheckpointDir) -> dict[str, Any]:
        if self.strategy.checkpoint_format == "deepspeed":
            self.strategy.model.load_checkpoint(str(checkpoint.path), tag="model_optim", load_optimizer_states=True,
                                                load_lr_scheduler_states=False)
        else:
            refuse_fused_layout(checkpoint.path / "model_optim")
            target = {"app": ModelOptimState(self.strategy.model, self.strategy.optimizer, loading=True),
                      **self._beside()}
            dcp.load(target, checkpoint_id=checkpoint.path / "model_optim", process_group=self.group)
        trainer_state: dict[str, Any] = torch.load(checkpoint.path / "trainer_state.pt", weights_only=False)
        self.strategy.scheduler.load_state_dict(trainer_state.pop("scheduler"))
        self.strategy.load_scaler_state_dict(trainer_state.pop("scaler"))
        rng_file = checkpoint.path / f"rng_rank{self.env.rank}.pt"
        if rng_file.is_file() and trainer_state.get("world_size") == self.env.world_size:
            set_rng_state(torch.load(rng_file, weights_only=False))
            compression_file = checkpoint.path / f"gradcomm_rank{self.env.rank}.pt"
            if self.strategy.compression is not None and compression_file.is_file():
                self.strategy.compression.load_state_dict(torch.load(compression_file, weights_only=False))
        elif self.env.is_main:
            log.warning("world size changed (%s -> %d): RNG streams start fresh; data order is kept",
                        trainer_state.get("world_size"), self.env.world_size)
        self.last_saved_step = checkpoint.step
        self.loaded = trainer_state
        return trainer_state
