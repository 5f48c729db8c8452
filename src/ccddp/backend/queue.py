"""The op queue: one thread per ccddp process group that runs its collectives in the
order they were issued.

torch.distributed requires every rank to issue a group's collectives in the same order,
so one FIFO per group keeps the ranks' sealed collectives (and their link counters) in
step without any extra coordination, while the issuing thread -- DDP's backward -- goes
on. After a failure the group's collective stream is out of step with its peers: every
later op fails with the same error instead of sending more frames.

Futures are completed from a small pool, not from the queue's thread: completing a future
runs its callbacks, and a callback may issue another op of this group and wait for it
(PowerSGD's hook does), which the queue's thread must then be free to run.

Example::

    q = OpQueue("ccddp-0")
    fut = q.submit(lambda: all_reduce(t, group), result=[t])
    fut.wait()
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch


class OpQueue:
    def __init__(self, name: str) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._failure: BaseException | None = None
        # Callbacks that wait on later ops nest: each level holds one completing thread.
        self._completer = ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"{name}-done")
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None], result) -> torch.futures.Future:
        """Run ``job`` after every op submitted before it; the future then holds ``result``."""
        fut: torch.futures.Future = torch.futures.Future()
        self._queue.put((job, result, fut))
        return fut

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            job, result, fut = item
            if self._failure is not None:
                self._completer.submit(fut.set_exception, self._failure)
                continue
            try:
                job()
            except BaseException as e:  # handed to the issuing thread through the future
                self._failure = e
                self._completer.submit(fut.set_exception, e)
            else:
                self._completer.submit(fut.set_result, result)

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped this group's collectives, if any."""
        return self._failure

    def close(self, timeout_s: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout=timeout_s)
        self._completer.shutdown(wait=False)
