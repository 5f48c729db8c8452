"""Point-to-point frames over torch.distributed, with finite waits.

Every byte of a collective goes through :class:`Transport`, so tests (and users checking
their cluster) can put an adversary on the link by subclassing it (see
``ccddp.comm.adversary``). gloo P2P work objects have no futures; completion is polled
with ``is_completed`` and awaited with a timeout.
"""

from __future__ import annotations

import re
from datetime import timedelta

import torch
import torch.distributed as dist

from ccddp.errors import PeerTimeoutError


class Transport:
    """Sends and receives uint8 tensors between ranks of one process group.

    Ranks are group ranks; they are translated to global ranks for torch.distributed.
    gloo matches a receive to a send by peer and ``tag``, in posting order; a secure
    collective sends its data on a tag of its own (see ``ccddp.comm.collectives``).
    """

    def __init__(self, pg: dist.ProcessGroup, timeout_s: float, *,
                 downward: dist.ProcessGroup | None = None) -> None:
        self.pg = pg
        self.downward = downward
        self.rank = dist.get_rank(pg)
        self.timeout = timedelta(seconds=timeout_s)
        self._global = [dist.get_global_rank(pg, r) for r in range(dist.get_world_size(pg))]

    def _link(self, src: int, dst: int) -> dist.ProcessGroup:
        # gloo serializes a connection's reads and writes on one lock, so a rank that
        # sends to the peer it is receiving from (2 ranks, tree) would wait for the
        # incoming message before it may start its own: with ``downward`` each direction
        # of a link has a connection of its own.
        return self.downward if self.downward is not None and src > dst else self.pg

    def isend(self, frame: torch.Tensor, dst: int, tag: int = 0):
        try:
            return dist.isend(frame, self._global[dst], group=self._link(self.rank, dst), tag=tag)
        except RuntimeError as e:
            raise self.peer_failed(e, f"cannot send to rank {dst}") from None

    def irecv(self, frame: torch.Tensor, src: int, tag: int = 0):
        try:
            return dist.irecv(frame, self._global[src], group=self._link(src, self.rank), tag=tag)
        except RuntimeError as e:
            raise self.peer_failed(e, f"cannot receive from rank {src}") from None

    def peer_failed(self, e: Exception, what: str) -> PeerTimeoutError:
        """A typed, one-line error for a P2P call that gloo refused (a peer died or timed
        out and its connection was closed)."""
        return PeerTimeoutError(f"rank {self.rank}: {what}: {gloo_reason(e)}")

    def wait(self, work, peer: int, what: str) -> None:
        """Wait for ``work`` or raise :class:`PeerTimeoutError` naming the peer."""
        try:
            work.wait(self.timeout)
        except RuntimeError as e:
            raise PeerTimeoutError(
                f"rank {self.rank}: {what} with rank {peer} did not complete within "
                f"{self.timeout.total_seconds():g}s or the peer failed ({gloo_reason(e)})") from None


def gloo_reason(e: Exception) -> str:
    """gloo's first error line without its source location and socket addresses: short
    enough for a one-line reason, and free of ``]:`` that log prefixes are split on."""
    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    if "Connection closed by peer" in first or "Connection reset by peer" in first:
        return "the connection was closed: the peer exited or crashed"
    if "Timed out" in first or "timed out" in first:
        return "timed out"
    first = re.sub(r"^\[[^\]]*\]\s*", "", first)
    return re.sub(r"\[[^\]]*\]:\d+", "<peer>", first)[:200]
