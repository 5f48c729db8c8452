"""The ordered wire: device frames over NCCL point-to-point, which matches by order, not tag.

NCCL's point-to-point differs from gloo's in the two ways the pipeline's schedule rests on:

- it ignores tags: the k-th send from rank a to rank b meets the k-th receive b posts from a;
- a communicator runs its operations in order, on one stream: an operation starts when the
  one before it is done. A receive posted on its own waits for its send and holds up
  everything posted after it -- the send its peer's receive waits for included -- so the
  gloo plan (every receive posted before the first send) deadlocks on NCCL.

So a wire here posts **groups** (:meth:`OrderedWire.post`: one send and one receive, started
together as ``batch_isend_irecv`` starts its list), and the pipeline pairs the i-th send of
a collective with its i-th receive, which every rank of a ring does alike (``pipeline``
says why that cannot deadlock). No tag keeps two collectives' messages apart either, so the
collective's sealed descriptors are checked before any data is posted.

Waits are bounded: NCCL's own wait on a work object blocks without a limit, so
:meth:`OrderedWire.wait` polls the group's completion up to the group's timeout. A wire
that timed out, or whose collective failed half-way, may hold half-matched operations;
it is **broken** from then on and refuses every later post at once (recreate the process
group), instead of pairing a new collective's frames with the old one's.

Example::

    wire = NcclWire.open(store, rank, size, timeout_s=60)     # collective over the group
    work = wire.post(send=(sealed, right), recv=(landing, left))
    wire.wait(work, left, FrameLabel(f"{left}->{rank}", "all_reduce#3"))
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ccddp.errors import FrameLabel, PeerTimeoutError, one_line

# How often a wait looks at a group's completion: short against a segment's transfer
# (a 4 MiB frame crosses NVLink in ~10 us, PCIe in ~200 us) without spinning a core.
POLL_S = 20e-6


class OrderedWire:
    """Posts step groups of frames to peers of one group and waits for them, bounded.

    Subclasses say how a group is posted (:meth:`_post_group`, returning a work object
    with ``is_completed()`` and ``wait()``); this class keeps the invariants: frames of one
    device, bounded waits, and a broken wire refusing further use.
    """

    name = "ordered"

    def __init__(self, rank: int, timeout_s: float) -> None:
        self.rank = rank
        self.timeout_s = timeout_s
        self.broken: str | None = None

    def post(self, send: tuple[torch.Tensor, int] | None = None,
             recv: tuple[torch.Tensor, int] | None = None):
        """Start ``send`` (frame, destination) and ``recv`` (frame, source) together; one
        work object for both."""
        if self.broken is not None:
            raise PeerTimeoutError(f"rank {self.rank}: this group's {self.name} wire failed earlier "
                                   f"({self.broken}) and cannot carry frames any more: recreate the process group")
        if send is None and recv is None:
            raise ValueError("a group needs a send or a receive")
        try:
            return self._post_group(send, recv)
        except RuntimeError as e:
            self.fail(one_line(str(e))[:200])
            raise PeerTimeoutError(f"rank {self.rank}: the {self.name} wire refused a frame: {self.broken}") from None

    def wait(self, work, peer: int, label: FrameLabel) -> None:
        """Wait for the group ``work`` (and order the caller's stream after it), or raise
        :class:`PeerTimeoutError` naming the peer once the group's timeout has passed."""
        deadline = time.monotonic() + self.timeout_s
        while not work.is_completed():
            if time.monotonic() > deadline:
                self.fail(f"no answer from rank {peer} within {self.timeout_s:g}s")
                raise PeerTimeoutError(f"rank {self.rank}: waiting for rank {peer} ({label}) on the {self.name} "
                                       f"wire: no answer within {self.timeout_s:g}s, or the peer failed",
                                       label=label)
            time.sleep(POLL_S)
        work.wait()

    def close(self) -> None:
        """Release what the wire holds (the group's shutdown calls this)."""

    def fail(self, reason: str) -> None:
        """Mark the wire broken (the first reason is kept)."""
        if self.broken is None:
            self.broken = reason

    def _post_group(self, send, recv):
        raise NotImplementedError


class NcclWire(OrderedWire):
    """An internal NCCL communicator over the group's ranks (one GPU per rank); nothing
    else knows of it, and it carries sealed frames only."""

    name = "NCCL"

    def __init__(self, pg: dist.ProcessGroup, rank: int, timeout_s: float) -> None:
        super().__init__(rank, timeout_s)
        self.pg = pg

    @classmethod
    def open(cls, store, rank: int, size: int, timeout_s: float) -> "NcclWire":
        """Make the communicator's process group (collective: every rank of the group calls
        it; NCCL connects on the first group posted, which every rank of a ring posts)."""
        opts = dist.ProcessGroupNCCL.Options()
        opts.is_high_priority_stream = False
        opts._timeout = timedelta(seconds=max(60.0, timeout_s))
        backend = dist.ProcessGroupNCCL(store, rank, size, opts)
        backend._set_sequence_number_for_group()     # as torch's own group creation does
        pg = dist.ProcessGroup(store, rank, size)
        pg._register_backend(torch.device("cuda"), dist.ProcessGroup.BackendType.NCCL, backend)
        pg._set_default_backend(dist.ProcessGroup.BackendType.NCCL)
        return cls(pg, rank, timeout_s)

    def close(self) -> None:
        # NCCL communicators are aborted, not left to the process's exit (where torch warns
        # about a process group that was never destroyed).
        try:
            self.pg.shutdown()
        except RuntimeError:
            pass

    def _post_group(self, send, recv):
        device = (send or recv)[0].device
        with torch.cuda.device(device):
            # One NCCL group: what batch_isend_irecv does for a registered group.
            self.pg._start_coalescing(device)
            if send is not None:
                self.pg.send([send[0]], send[1], 0)
            if recv is not None:
                self.pg.recv([recv[0]], recv[1], 0)
            return self.pg._end_coalescing(device)


__all__ = ["NcclWire", "OrderedWire"]
