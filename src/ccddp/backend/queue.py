"""The op queue: one thread per ccddp process group that runs its collectives in the
order they were issued.

torch.distributed requires every rank to issue a group's collectives in the same order,
so one FIFO per group keeps the ranks' sealed collectives (and their link counters) in
step without any extra coordination, while the issuing thread -- DDP's backward -- goes
on. After a failure the group's collective stream is out of step with its peers: every
later op fails with the same error instead of sending more frames.

Futures are completed from a small pool, not from the queue's thread: completing a future
runs its callbacks, and a callback may issue another op of this group and wait for it
(PowerSGD's hook does), which the queue's thread must then be free to run. A caller that
waits (``Ticket.wait``) is woken by the queue's thread directly, one hand-off sooner.

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


class Ticket:
    """One submitted op: its future, and an event set as soon as the op has run."""

    def __init__(self) -> None:
        self.future: torch.futures.Future = torch.futures.Future()
        self.done = threading.Event()
        self.error: BaseException | None = None

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until the op has run (False on timeout); raise its error if it failed."""
        if not self.done.wait(timeout_s):
            return False
        if self.error is not None:
            raise self.error
        return True


class OpQueue:
    def __init__(self, name: str) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._failure: BaseException | None = None
        # Callbacks that wait on later ops nest: each level holds one completing thread.
        self._completer = ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"{name}-done")
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None], result) -> Ticket:
        """Run ``job`` after every op submitted before it; the ticket's future then holds
        ``result``."""
        ticket = Ticket()
        self._queue.put((job, result, ticket))
        return ticket

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            job, result, ticket = item
            if self._failure is None:
                try:
                    job()
                except BaseException as e:  # handed to the issuing thread through the ticket
                    self._failure = e
            ticket.error = self._failure
            ticket.done.set()
            if ticket.error is not None:
                self._completer.submit(ticket.future.set_exception, ticket.error)
            else:
                self._completer.submit(ticket.future.set_result, result)

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped this group's collectives, if any."""
        return self._failure

    def close(self, timeout_s: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout=timeout_s)
        self._completer.shutdown(wait=False)
