"""NCCL's point-to-point ordering, emulated over gloo, so the ordered schedule runs on CPU.

:class:`SerialWire` is an :class:`~ccddp.comm.ordered.OrderedWire` that keeps NCCL's two
rules with gloo underneath: every message goes on one tag (tags ignored: the k-th send of a
pair meets the k-th receive), and a rank's groups run one after another on one worker
thread (one stream: a group starts when the one before it is done, its send and receive
together). A schedule that would deadlock on NCCL -- a receive posted alone before the
send its peer waits for -- deadlocks here too, and ends in the wire's timeout.

Example::

    up, down = dist.new_group(backend="gloo"), dist.new_group(backend="gloo")
    group.transport.ordered = SerialWire(Transport(up, 30, downward=down), timeout_s=30)
"""

from __future__ import annotations

import queue
import threading

from ccddp.comm.ordered import OrderedWire
from ccddp.comm.transport import Transport
from ccddp.errors import CCDDPError, FrameLabel


class _GroupWork:
    def __init__(self) -> None:
        self.done = threading.Event()

    def is_completed(self) -> bool:
        return self.done.is_set()

    def wait(self) -> bool:
        return True


class SerialWire(OrderedWire):
    """Groups run in posting order on one thread, their messages on gloo tag 0."""

    name = "serial (emulated NCCL)"

    def __init__(self, transport: Transport, timeout_s: float) -> None:
        super().__init__(transport.rank, timeout_s)
        self.transport = transport
        self.groups_posted = 0
        self._todo: queue.Queue = queue.Queue()
        threading.Thread(target=self._run, name="serial-wire", daemon=True).start()

    def _post_group(self, send, recv):
        work = _GroupWork()
        self.groups_posted += 1
        self._todo.put((send, recv, work))
        return work

    def _run(self) -> None:
        while True:
            send, recv, work = self._todo.get()
            try:
                posted = []
                if send is not None:
                    posted.append((self.transport.isend(send[0], send[1], 0), send[1]))
                if recv is not None:
                    posted.append((self.transport.irecv(recv[0], recv[1], 0), recv[1]))
                for w, peer in posted:
                    self.transport.wait(w, peer, FrameLabel("serial wire", "group"))
            except CCDDPError:
                # A group that never completes: its waiter times out, as on NCCL; the
                # groups after it never start.
                return
            work.done.set()


__all__ = ["SerialWire"]
