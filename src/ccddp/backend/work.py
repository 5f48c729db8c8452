"""Work objects the ``ccddp`` process group returns: public ``torch.distributed.Work``
subclasses, as PyTorch's own tests of Python process groups use them.

A collective's work is backed by a ``torch.futures.Future`` that ccddp's op queue
completes once the op has run (on its worker, or on a caller that waited for it first);
DDP's reducer chains on :meth:`CollectiveWork.get_future`, so backward goes on while the
sealed collective runs. A point-to-point work wraps the
posted sealed message; its future is completed by a helper thread on first request.

Example::

    work = dist.all_reduce(t, group=ccddp_group, async_op=True)
    work.get_future().then(lambda f: print("done", f.value()[0]))
    work.wait()                     # raises the typed error (IntegrityError, ...) on failure
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from ccddp.errors import PeerTimeoutError


def _seconds(timeout) -> float | None:
    """None for "no timeout" (torch passes a zero timedelta for that)."""
    if timeout is None:
        return None
    s = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    return s if s > 0 else None


class CollectiveWork(dist.Work):
    """A collective queued on ccddp's op queue; its future holds the output tensors."""

    def __init__(self, queue, ticket, op: str) -> None:
        super().__init__()
        self._queue = queue
        self._ticket = ticket
        self.op = op

    def wait(self, timeout=None) -> bool:
        limit = _seconds(timeout)
        if not self._queue.wait(self._ticket, limit):  # raises the collective's typed error
            raise PeerTimeoutError(f"{self.op} did not complete within {limit:g}s")
        return True

    def get_future(self) -> torch.futures.Future:
        return self._queue.future(self._ticket)

    def is_completed(self) -> bool:
        if self._ticket.finished:
            return True
        self._queue.start(self._ticket)  # polled, not waited for: the worker runs it
        return False

    def is_success(self) -> bool:
        return self.is_completed() and self._ticket.error is None

    def exception(self):
        return self._ticket.error

    def result(self) -> list:
        self.wait()
        return self._ticket.result

    def synchronize(self) -> None:
        pass


class PeerWork(dist.Work):
    """A sealed send or receive; gloo's completion is consumed once, by whichever of
    :meth:`wait` or the future's helper thread gets there first."""

    def __init__(self, pending, result: list[torch.Tensor], op: str, *,
                 devices: list[torch.device] | None = None, then: Callable[[], object] | None = None) -> None:
        super().__init__()
        self._pending = pending
        # ``then``: what completes the result once the message is verified (a received
        # device tensor's copy from host memory); ``devices``: its future's devices.
        self._then = then
        self._devices = devices
        self._result = result
        self.op = op
        self._lock = threading.Lock()
        self._finished = False
        self._error: BaseException | None = None
        self._future: torch.futures.Future | None = None
        self._source = getattr(pending, "peer", None)

    def _finish(self, timeout=None) -> None:
        with self._lock:
            if not self._finished:
                limit = _seconds(timeout)
                try:
                    got = self._pending.wait(timedelta(seconds=limit) if limit is not None else None)
                    if got is not None:
                        self._source = got
                    if self._then is not None:
                        self._then()
                except BaseException as e:
                    self._error = e
                self._finished = True
        if self._error is not None:
            raise self._error

    def wait(self, timeout=None) -> bool:
        self._finish(timeout)
        return True

    def get_future(self) -> torch.futures.Future:
        with self._lock:
            if self._future is None:
                self._future = torch.futures.Future(devices=self._devices)
                threading.Thread(target=self._complete_future, name=f"ccddp-{self.op}", daemon=True).start()
            return self._future

    def _complete_future(self) -> None:
        try:
            self._finish()
        except BaseException as e:
            self._future.set_exception(e)
        else:
            self._future.set_result(self._result)

    def is_completed(self) -> bool:
        return self._finished

    def is_success(self) -> bool:
        return self._finished and self._error is None

    def exception(self):
        return self._error

    def result(self) -> list:
        self.wait()
        return self._result

    def source_rank(self) -> int:
        self._finish()
        return -1 if self._source is None else self._source

    def _source_rank(self) -> int:
        return self.source_rank()

    def synchronize(self) -> None:
        pass
