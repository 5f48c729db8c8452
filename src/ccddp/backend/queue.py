"""The op queue: the ops of one ccddp process group, run one at a time in the order they
were issued.

torch.distributed requires every rank to issue a group's collectives in the same order,
so one FIFO per group keeps the ranks' sealed collectives (and their link counters) in
step without any extra coordination, while the issuing thread -- DDP's backward -- goes
on. After a failure the group's collective stream is out of step with its peers: every
later op fails with the same error instead of sending more frames.

Who runs an op. A synchronous call (``dist.all_reduce(t)``) waits for its op at once: the
waiting thread runs the op itself when it is next in line and none runs. Waking a second
thread for it would cost more than sealing a 1 MiB message on a busy 2-core machine: the
woken thread competes for the GIL and for a core with the op it was woken for. So
submitting does not wake the queue's worker; the worker is woken as soon as anything shows
that the caller goes on without waiting -- the op's future is asked for (DDP asks for
every bucket's), its completion is polled, it is waited for with a timeout, or another op
is queued behind it -- and, failing all of those, it takes an op nobody has claimed within
``UNCLAIMED_START_S``. Order is the same whoever runs an op: after every op submitted
before it, before every op submitted after it.

An op's ``torch.futures.Future`` is made only when asked for (a synchronous call never
asks, and skips its cost). A future asked for before the op has run is completed from a
small pool, not from the thread that ran the op: completing a future runs its callbacks,
and a callback may issue another op of this group and wait for it (PowerSGD's hook does),
which must then be free to run. One asked for afterwards is returned already completed.

What each op sealed and opened. Given the group's crypto counters (a function that returns
them as :meth:`CryptoCounters.values <ccddp.crypto.counters.CryptoCounters.values>` does),
the queue counts each op's share under the op's name (``counted``): ops run one at a time,
so the counters' change across a job is that job's alone -- provided nothing else seals on
those counters meanwhile (the backend keeps point-to-point messages on counters of their
own for this reason).

Example::

    q = OpQueue("ccddp-0")
    ticket = q.submit(lambda: all_reduce(t, group), result=[t])
    q.wait(ticket)               # runs the op on this thread: it is next and none runs
"""

from __future__ import annotations

import collections
import enum
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from ccddp.backend.eager import keep_eager
from ccddp.comm import probe
from ccddp.crypto.counters import CountersByOp

#: How long an op may wait unclaimed before the worker starts it (the worker's idle poll).
UNCLAIMED_START_S = 0.05


class TicketState(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"


class Ticket:
    """One submitted op: what it is, its job, its state, and (made only when a thread must
    block on it) a latch released once the op has run."""

    def __init__(self, job: Callable[[], None], result, op: str, devices: list | None = None) -> None:
        self.job = job
        # The CUDA devices of the result's tensors: its future is made for them.
        self.devices = devices
        self.result = result
        self.op = op
        self.state = TicketState.QUEUED
        self.future: torch.futures.Future | None = None  # made by OpQueue.future
        self.error: BaseException | None = None
        self.thread: str | None = None  # the name of the thread that ran it (diagnostics, tests)
        # A held lock that a blocked waiter takes and returns; made by the first waiter that
        # must block, under the queue's lock. A synchronous call runs its op itself and
        # never blocks: it pays for no lock.
        self.latch: threading.Lock | None = None

    @property
    def finished(self) -> bool:
        return self.state is TicketState.DONE


def _complete(future: torch.futures.Future, ticket: Ticket) -> None:
    if ticket.error is not None:
        future.set_exception(ticket.error)
    else:
        future.set_result(ticket.result)


class OpQueue:
    def __init__(self, name: str, counters: Callable[[], tuple] | None = None) -> None:
        self._pending: collections.deque[Ticket] = collections.deque()
        # ``counters``: the crypto counters the ops seal on, as a tuple (CryptoCounters.values);
        # each op's change of them is summed under its name in ``counted``.
        self._counters = counters
        self.counted = CountersByOp()
        # The op being run (by the worker or by a waiting caller), if any, and how many ops
        # of each name were submitted: diagnostics and tests read them.
        self.running: Ticket | None = None
        self.submitted: collections.Counter[str] = collections.Counter()
        self._closed = False
        self._cond = threading.Condition()
        self._failure: BaseException | None = None
        # Callbacks that wait on later ops nest: each level holds one completing thread.
        self._completer = ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"{name}-done")
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None], result, op: str = "op", devices: list | None = None) -> Ticket:
        """Queue ``job`` to run after every op submitted before it; ``result`` is what the
        ticket's future then holds (``devices``: the CUDA devices of its tensors), ``op``
        what it is called in diagnostics."""
        if probe.ON:
            probe.stamp("call: c10d + checks + staging")
        ticket = Ticket(job, result, op, devices)
        with self._cond:
            # An op still queued in front of this one was not waited for: start it.
            if self._pending:
                self._cond.notify()
            self._pending.append(ticket)
            self.submitted[op] += 1
        if probe.ON:
            probe.stamp("queue: submit + work")
        return ticket

    def start(self, ticket: Ticket) -> None:
        """Have the worker run ``ticket`` (and what is queued before it) without waiting
        for anyone to claim it."""
        with self._cond:
            if ticket.state is TicketState.QUEUED:
                self._cond.notify()

    def wait(self, ticket: Ticket, timeout_s: float | None = None) -> bool:
        """Wait until ``ticket``'s op has run (False on timeout); raise its error if it
        failed. Without a timeout, an op that is next in line while none runs is run here."""
        if timeout_s is None and self._take(ticket):
            self._run(ticket)
        elif not self._block_until_run(ticket, timeout_s):
            return False
        if ticket.error is not None:
            raise ticket.error
        return True

    def _block_until_run(self, ticket: Ticket, timeout_s: float | None) -> bool:
        with self._cond:
            if ticket.state is TicketState.DONE:
                return True
            if ticket.state is TicketState.QUEUED:
                self._cond.notify()  # not next, or waited for with a timeout: the worker runs it
            if ticket.latch is None:
                ticket.latch = threading.Lock()
                ticket.latch.acquire()
            latch = ticket.latch
        if not latch.acquire(timeout=-1 if timeout_s is None else max(0.0, timeout_s)):
            return False
        latch.release()
        return True

    def future(self, ticket: Ticket) -> torch.futures.Future:
        """``ticket``'s future, completed with its result (or error) once the op has run;
        asking for it starts the op."""
        with self._cond:
            if ticket.future is not None:
                return ticket.future
            ticket.future = torch.futures.Future(devices=ticket.devices)
            if ticket.state is TicketState.QUEUED:
                self._cond.notify()
            if ticket.state is not TicketState.DONE:
                return ticket.future  # _run completes it
        _complete(ticket.future, ticket)
        return ticket.future

    def _take(self, ticket: Ticket) -> bool:
        """Claim ``ticket`` for the calling thread if it is next and nothing runs."""
        with self._cond:
            if self.running is not None or not self._pending or self._pending[0] is not ticket:
                return False
            self._claim_next()
            return True

    def _claim_next(self) -> Ticket:
        """Pop the next op and mark it running (the caller holds ``_cond``)."""
        ticket = self._pending.popleft()
        self.running = ticket
        ticket.state = TicketState.RUNNING
        return ticket

    def _run(self, ticket: Ticket) -> None:
        ticket.thread = threading.current_thread().name
        # Probed from here when no caller began the op (an asynchronous op, run by the worker).
        probed = probe.ON and probe.begin(f"queued {ticket.op}")
        if self._failure is None:
            before = self._counters() if self._counters is not None else None
            if probe.ON:
                probe.stamp("queue: claim + counter snapshot")
            try:
                ticket.job()
            except BaseException as e:  # handed to the waiting thread through the ticket
                self._failure = e
            finally:
                if before is not None:
                    # A failed op sealed and opened too (up to the frame that failed).
                    self.counted.add_between(ticket.op, self._counters(), before)
        ticket.error = self._failure
        ticket.job = None  # drop the closure (and the tensors it holds) once run
        with self._cond:
            ticket.state = TicketState.DONE
            self.running = None
            if self._pending:  # the worker runs what queued up behind this op
                self._cond.notify()
            future, latch = ticket.future, ticket.latch
        if latch is not None:
            latch.release()
        if future is not None:
            self._completer.submit(_complete, future, ticket)
        if probe.ON:
            probe.stamp("queue: counters diff + done")
        if probed:
            probe.end("queue: completion handed off")

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self.running is not None or not self._pending:
                    if self._closed and not self._pending:
                        return
                    self._cond.wait(UNCLAIMED_START_S)
                ticket = self._claim_next()
            self._run(ticket)

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped this group's collectives, if any."""
        return self._failure

    def close(self, timeout_s: float = 5.0) -> None:
        """Run what is queued, then stop the worker (waiting at most ``timeout_s``)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=timeout_s)
        self._completer.shutdown(wait=False)


# What runs an op on the caller's thread is kept out of dynamo's tracing: under
# ``torch.compile`` a collective's wait must run the sealed op, not trace it.
keep_eager(OpQueue, "start", "wait", "future")
