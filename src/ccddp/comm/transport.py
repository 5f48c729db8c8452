"""Bytes between ranks over torch.distributed, with finite waits.

Every byte of a collective goes through :class:`Transport` -- the point-to-point frames
of the data and the plaintext all-gathers of the setup (:meth:`Transport.exchange`) --
so tests (and users checking their cluster) can put an adversary on the link by
subclassing it (see ``ccddp.testing.adversary``). gloo P2P work objects have no futures;
completion is polled with ``is_completed`` and awaited with a timeout.

One wire path: a process group's own ``send``/``recv``/``allgather`` in group ranks, which
a registered torch.distributed group and a bare gloo backend that nothing else knows of
(the ``ccddp`` backend's internal links) both have.

Frames in device memory (a device tensor's sealed segments) cross through host memory:
gloo moves host bytes only, and by then they are ciphertext. A send copies its frame to a
host buffer (pinned when the frame is on a GPU) and posts that; a receive lands in a host
buffer and is copied to its device frame when its wait returns, on the waiting thread's
current stream, so the open that follows on that stream sees it. This is the transport
that serves any number of ranks per GPU (NCCL refuses two ranks on one device) and GPUs
without peer access. Where every rank has a GPU of its own, the group may carry the
pipeline's device frames on an ordered wire instead (:attr:`Transport.ordered`, NCCL:
``ccddp.comm.ordered``).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist

from ccddp.errors import ConfigError, FrameLabel, PeerTimeoutError


def gloo_timeout(seconds: float) -> timedelta:
    """A wait limit for a gloo work: gloo counts whole milliseconds and reads 0 as "no
    timeout", so a limit under 1 ms (a tiny ``timeout_s``, a deadline just passed) would
    wait forever; it waits 1 ms instead."""
    return timedelta(seconds=max(seconds, 0.001))


class Transport:
    """Sends and receives uint8 tensors between ranks of one process group.

    Ranks are group ranks. gloo matches a receive to a send by peer and ``tag``, in posting order; a secure
    collective sends its data on a tag of its own (see ``ccddp.comm.collectives``).
    """

    @classmethod
    def open(cls, pg: dist.ProcessGroup | None, timeout_s: float) -> "Transport":
        """The links of a secure group over the registered group ``pg`` (default: the
        world): ``pg`` itself and, for the other direction of every link, a second gloo
        group over its ranks -- made here, collectively (every rank of ``pg`` calls this,
        as it would ``dist.new_group``), and kept until the process exits.

        Example::

            group = SecureGroup(settings, secret, pg, transport=Transport.open(pg, settings.timeout_s))
        """
        pg = pg if pg is not None else dist.group.WORLD
        downward = dist.new_group(dist.get_process_group_ranks(pg), backend="gloo",
                                  timeout=timedelta(seconds=max(60.0, timeout_s)), use_local_synchronization=True)
        return cls(pg, timeout_s, downward=downward)

    def __init__(self, pg: dist.ProcessGroup, timeout_s: float, *,
                 downward: dist.ProcessGroup | None = None) -> None:
        self.pg = pg
        self.downward = downward
        self.rank = pg.rank()
        self.timeout = gloo_timeout(timeout_s)
        # Frames on these device types go on the wire as they are; others cross through
        # a host buffer (tests empty it to run the staging on CPU frames).
        self.host_device_types = frozenset({"cpu"})
        # The ordered wire (NCCL) that carries the pipeline's device frames instead, if the
        # group has one (``ccddp.comm.ordered``).
        self.ordered = None

    def ordered_for(self, device: torch.device):
        """The ordered wire that carries frames on ``device``, or None (gloo carries them)."""
        return self.ordered if self.ordered is not None and device.type not in self.host_device_types else None

    def _link(self, src: int, dst: int) -> dist.ProcessGroup:
        # gloo serializes a connection's reads and writes on one lock, so a rank that
        # sends to the peer it is receiving from (2 ranks, tree) would wait for the
        # incoming message before it may start its own: with ``downward`` each direction
        # of a link has a connection of its own.
        return self.downward if self.downward is not None and src > dst else self.pg

    def _staged(self, frame: torch.Tensor) -> bool:
        return frame.device.type not in self.host_device_types

    def isend(self, frame: torch.Tensor, dst: int, tag: int = 0):
        if self._staged(frame):
            # The copy waits for the kernels that wrote the frame (same stream) and for
            # the bytes to land: gloo reads the host buffer from its own threads.
            host = host_buffer(frame)
            host.copy_(frame)
            frame = host
        try:
            return self.post_send(self._link(self.rank, dst), frame, dst, tag)
        except RuntimeError as e:
            raise self.peer_failed(e, f"cannot send to rank {dst}") from None

    def irecv(self, frame: torch.Tensor, src: int, tag: int = 0):
        staged = self._staged(frame)
        landing = host_buffer(frame) if staged else frame
        try:
            work = self.post_recv(self._link(src, self.rank), landing, src, tag)
        except RuntimeError as e:
            raise self.peer_failed(e, f"cannot receive from rank {src}") from None
        return _CopiedToDevice(work, landing, frame) if staged else work

    def post_send(self, pg: dist.ProcessGroup, frame: torch.Tensor, dst: int, tag: int):
        """gloo's send of ``frame`` to group rank ``dst`` on ``pg`` (raises RuntimeError)."""
        return pg.send([frame], dst, tag)

    def post_recv(self, pg: dist.ProcessGroup, frame: torch.Tensor, src: int, tag: int):
        """gloo's receive into ``frame`` from group rank ``src`` on ``pg`` (raises RuntimeError)."""
        return pg.recv([frame], src, tag)

    def peer_failed(self, e: Exception, what: str) -> PeerTimeoutError:
        """A typed, one-line error for a P2P call that gloo refused (a peer died or timed
        out and its connection was closed)."""
        return PeerTimeoutError(f"rank {self.rank}: {what}: {gloo_reason(e)}")

    def exchange(self, blob: bytes) -> list[bytes]:
        """Every rank's ``blob`` (a plaintext all-gather over the process group, within the
        timeout): how a group's setup messages travel. Collective."""
        return exchange_bytes(blob, self.pg, self.timeout.total_seconds())

    def wait(self, work, peer: int, label: FrameLabel) -> None:
        """Wait for ``work``, the send or receive of the frame ``label`` names, or raise
        :class:`PeerTimeoutError` naming the peer (the error carries ``label``)."""
        try:
            work.wait(self.timeout)
        except RuntimeError as e:
            raise PeerTimeoutError(
                f"rank {self.rank}: waiting for rank {peer} ({label}): no answer within "
                f"{self.timeout.total_seconds():g}s, or the peer failed ({gloo_reason(e)})", label=label) from None


def host_buffer(frame: torch.Tensor) -> torch.Tensor:
    """Host memory for ``frame``'s bytes: pinned for a CUDA frame (asynchronous copies, and
    torch's pinned-memory cache keeps it from being reused before a copy has read it)."""
    return torch.empty(frame.numel(), dtype=frame.dtype, pin_memory=frame.device.type == "cuda")


class _CopiedToDevice:
    """A receive that lands in host memory; waiting for it also copies the bytes to the
    device frame (once: a gloo completion is consumed by the wait that sees it)."""

    def __init__(self, work, host: torch.Tensor, frame: torch.Tensor) -> None:
        self.work, self.host, self.frame = work, host, frame

    def is_completed(self) -> bool:
        return self.work.is_completed()

    def wait(self, timeout: timedelta | None = None) -> bool:
        if timeout is None:
            self.work.wait()
        else:
            self.work.wait(timeout)
        self.frame.copy_(self.host, non_blocking=True)
        return True


# A control message is small; a larger announced size is refused before allocating.
MAX_CONTROL_BYTES = 1 << 26


def all_gather_flat(output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup | None = None,
                    timeout_s: float | None = None) -> None:
    """``output`` = every rank's ``input``, concatenated in rank order: the group's own
    plaintext all-gather. With ``timeout_s`` the wait is bounded (the process group's own
    timeout may be gloo's 30 minutes) and ends in :class:`PeerTimeoutError`."""
    pg = group if group is not None else dist.group.WORLD
    work = pg.allgather([list(output.chunk(pg.size()))], [input])
    if timeout_s is None:
        work.wait()
    else:
        bounded(work, timeout_s, "a control-plane exchange")


def bounded(work, timeout_s: float, what: str = "an exchange inside a trust domain") -> None:
    """Wait for a gloo collective's ``work`` at most ``timeout_s``; then, or if a peer
    failed, raise :class:`PeerTimeoutError`."""
    try:
        work.wait(gloo_timeout(timeout_s))
    except RuntimeError as e:
        raise PeerTimeoutError(f"{what} did not complete within {timeout_s:g}s: a peer failed, is slow to "
                               f"start, or was started with another world size ({gloo_reason(e)})") from None


def exchange_bytes(blob: bytes, pg: dist.ProcessGroup | None = None, timeout_s: float | None = None) -> list[bytes]:
    """All-gather one byte string per rank over ``pg``, in plaintext: plain uint8 tensors,
    never pickle, because ``*_object`` collectives unpickle what peers send and the host
    that carries those bytes could make a TEE run its code. What comes back is
    host-controlled: authenticate it before trusting it (:mod:`ccddp.crypto.session`
    does, for the setup; :func:`ccddp.comm.control.gather_sealed` seals instead).

    Example::

        names = exchange_bytes(socket.gethostname().encode())   # [b"node0", b"node1", ...]
    """
    pg = pg if pg is not None else dist.group.WORLD
    return gather_blobs(blob, pg.size(), lambda out, inp: all_gather_flat(out, inp, pg, timeout_s))


def gather_blobs(blob: bytes, world_size: int, gather: Callable[[torch.Tensor, torch.Tensor], None]) -> list[bytes]:
    """One byte string per rank through ``gather(output, input)``, an all-gather of flat
    tensors: lengths first, then the strings padded to the longest."""
    sizes = torch.zeros(world_size, dtype=torch.int64)
    gather(sizes, torch.tensor([len(blob)], dtype=torch.int64))
    width = max(1, int(sizes.max()))
    if width > MAX_CONTROL_BYTES or int(sizes.min()) < 0:
        raise ConfigError(f"a rank announced a control message of {width} bytes; refusing it")
    mine = torch.zeros(width, dtype=torch.uint8)
    if blob:
        mine[:len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    everyone = torch.empty(world_size * width, dtype=torch.uint8)
    gather(everyone, mine)
    raw = everyone.numpy().tobytes()
    return [raw[r * width:r * width + int(sizes[r])] for r in range(world_size)]


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
