"""Micro batches prepared off the critical path: a worker thread loads the next ones while the model trains.

The loop's data is a pure function of the global sample index (train/data/), so the worker simply walks the
indices the next steps will ask for, `steps_ahead` optimizer steps at most (a bounded queue). The loop asks for
each micro batch by its indices and gets exactly that one: a mismatch is a bug and fails loudly rather than
training on the wrong samples. Batches prefetched but never asked for (a stop, a crash) are dropped; resume
starts from `state.samples`, so nothing is skipped or repeated.

On CUDA the worker pins the batch and the loop copies it with non_blocking=True: the copy is queued on the
stream and the host goes on (the caching host allocator keeps the pinned block until the copy has run).

The thread is a daemon and close() joins it with a timeout, so it never keeps a stopping process alive (the
watchdog's os._exit, a crash, a preemption stop). A source whose samples draw from the global random generators
(a user's dataset doing random crops with torch.rand, say) would interleave those draws with training's: set
trainer.prefetch_steps=0 for such a dataset to load on the training thread as before.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence

import torch

from train.data import TokenSource, load_micro_batch

# How long the worker waits on a full queue before looking at the stop flag again, and close() on the worker.
_POLL_S = 0.05
_JOIN_S = 5.0


class BatchPrefetcher:
    def __init__(self, source: TokenSource, device: torch.device, plan: Iterator[Sequence[int]],
                 depth: int, documents: bool = False) -> None:
        """`plan`: the indices of every micro batch to come, in the order the loop asks for them; `depth`: how
        many micro batches may wait ready in the queue; `documents`: batches carry document ids
        (data.document_mask, train/data/batches.py)."""
        self.source, self.device, self.documents = source, device, documents
        self._pin = device.type == "cuda"
        self._queue: queue.Queue[tuple[list[int], tuple[torch.Tensor, ...] | BaseException]] = (
            queue.Queue(maxsize=max(depth, 1)))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, args=(plan,), name="slurmtrain-prefetch", daemon=True)
        self._thread.start()

    def _work(self, plan: Iterator[Sequence[int]]) -> None:
        for indices in plan:
            if self._stop.is_set():
                return
            item: tuple[torch.Tensor, ...] | BaseException
            try:
                batch = load_micro_batch(self.source, indices, self.documents)
                item = tuple(x.pin_memory() for x in batch) if self._pin else batch
            except BaseException as e:  # handed to the training thread, raised there at this micro batch
                item = e
            while not self._stop.is_set():
                try:
                    self._queue.put((list(indices), item), timeout=_POLL_S)
                    break
                except queue.Full:
                    continue
            if isinstance(item, BaseException):
                return

    def get(self, indices: Sequence[int]) -> tuple[torch.Tensor, ...]:
        """The micro batch of these indices, on the device (the copy may still be in flight on CUDA)."""
        while True:
            try:
                got, item = self._queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError(f"the data prefetch thread ended before samples {_span(indices)}") from None
        if isinstance(item, BaseException):
            raise item
        if got != list(indices):
            raise RuntimeError(f"data prefetch out of step: asked for samples {_span(indices)}, the next prepared "
                               f"batch holds {_span(got)}")
        return tuple(x.to(self.device, non_blocking=True) for x in item)

    def close(self) -> list[list[int]]:
        """Stop the worker and drop whatever it prepared (returned: the indices of each dropped micro batch);
        never blocks for long, and may be called again."""
        self._stop.set()
        self._thread.join(timeout=_JOIN_S)
        dropped: list[list[int]] = []
        while True:
            try:
                indices, _ = self._queue.get_nowait()
            except queue.Empty:
                return dropped
            dropped.append(indices)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


def to_device(batch: Sequence[torch.Tensor], device: torch.device) -> tuple[torch.Tensor, ...]:
    """A micro batch loaded on the training thread (no prefetch, a pipeline's step) onto the device: pinned first
    on CUDA, so that the copy is queued and the host goes on, as the prefetcher's are."""
    if device.type == "cuda":
        batch = [x.pin_memory() for x in batch]
    return tuple(x.to(device, non_blocking=True) for x in batch)


def describe_dropped(dropped: list[list[int]]) -> str:
    samples = sorted(i for indices in dropped for i in indices)
    return f"{len(dropped)} micro batches (samples {_span(samples)})" if dropped else "no micro batches"


def _span(indices: Sequence[int]) -> str:
    return f"{indices[0]}..{indices[-1]}" if len(indices) else "(none)"
