"""One FIFO communication thread per process.

DDP calls the comm hook from the backward pass; the hook only enqueues, so backward
continues while this thread runs the secure all-reduce of earlier buckets. DDP launches
buckets in the same order on every rank, so a single FIFO keeps the ranks' collectives
in the same order without any extra coordination.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable

import torch


class CommWorker:
    """Runs ``fn(tensor)`` for each submitted tensor, in order, on a background thread;
    completes the returned future with the tensor or with the exception raised.

    Example::

        worker = CommWorker(lambda t: all_reduce(t, group))
        fut = worker.submit(bucket.buffer())
        fut.wait()
    """

    def __init__(self, fn: Callable[[torch.Tensor], None], name: str = "ccddp-comm") -> None:
        self._fn = fn
        self._queue: queue.Queue = queue.Queue()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, tensor: torch.Tensor) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        self._queue.put((tensor, fut))
        return fut

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            tensor, fut = item
            if self._failure is not None:
                # After a failure the collective stream is out of step with the peers:
                # fail everything after it instead of sending more frames.
                fut.set_exception(self._failure)
                continue
            try:
                self._fn(tensor)
            except BaseException as e:  # handed to the training thread through the future
                self._failure = e
                fut.set_exception(e)
            else:
                fut.set_result(tensor)

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)
