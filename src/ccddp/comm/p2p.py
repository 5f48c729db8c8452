"""Sealed point-to-point messages: ``send``/``recv`` (and receive-from-any) with tags.

A point-to-point message belongs to no collective, so it cannot share the collectives'
link counters: a program may post sends and receives in any order relative to its
collectives, and on different tags. Each ``(src, dst, tag)`` is a stream of its own,
with its own key (HKDF from the group secret and session, bound to the link and the tag)
and counter. Both ends take counters in program order -- the sender when it posts a
send, the receiver when it posts a receive from a named source -- so a replayed,
reordered or dropped message fails its tag, as in the collectives.

A message is ``length || ciphertext || tag``: ``length`` (8 bytes, big-endian) is the
plaintext's byte count, bound by the AAD, so a receive larger than the message takes it
into its first bytes and leaves the rest as it was, as gloo does (gloo's limit stays: a
message longer than the receive ends the process). The bytes are the tensor's, as on
gloo's wire: a receive of another dtype reads them as its own.

A receive from any source learns its sender only when the message has arrived, so it
takes the next counter of that sender's stream then -- in posting order among the
receives from any source on its tag, whatever order they are waited in: gloo hands a
tag's messages to its receives from any source first posted, first served, so when one
completes every one posted before it on that tag has, and takes its counter first. A
program that mixes receives from any source with receives from a named source on the same
tag, while both are pending, can see a genuine message rejected (the sender's stream order
is then not the posting order); nothing unauthenticated is ever accepted.

The messages travel on a transport of their own (not the collectives' links), so a
user's tags never meet the collectives' descriptor and data tags, and are counted on
counters of their own (``counters``): a send posted while a collective runs does not show
in what that collective sealed.

Example::

    links = SealedPeerLinks(group, Transport(p2p_pg, timeout_s=60))
    if rank == 0:
        links.isend(torch.arange(4.0), dst=1, tag=7).wait()
    else:
        x = torch.empty(4)
        links.irecv(x, src=0, tag=7).wait()
"""

from __future__ import annotations

import struct
import threading
from datetime import timedelta

import torch

from ccddp.comm.endpoint import Endpoint
from ccddp.comm.transport import Transport, gloo_timeout
from ccddp.crypto.aad import FrameContext, Op, Phase
from ccddp.crypto.channel import MAX_FRAME_BYTES, TAG_BYTES, LinkChannel, link_id
from ccddp.crypto.counters import CryptoCounters
from ccddp.crypto.keys import derive_purpose_key
from ccddp.errors import ConfigError, FrameLabel, PeerTimeoutError


#: A message's first bytes: its plaintext's byte count.
LENGTH = struct.Struct(">Q")


def _plain(t: torch.Tensor, what: str) -> torch.Tensor:
    if t.device.type != "cpu":
        raise ConfigError(f"{what}: ccddp seals CPU tensors (got {t.device})")
    if not t.is_contiguous():
        raise ConfigError(f"{what}: tensor must be contiguous")
    if t.numel() * t.element_size() > MAX_FRAME_BYTES:
        raise ConfigError(f"{what}: a message is at most {MAX_FRAME_BYTES >> 30} GiB; split the tensor")
    return t.view(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


class PendingSend:
    """A posted sealed send; :meth:`wait` returns once gloo has handed it over."""

    def __init__(self, links: "SealedPeerLinks", work, frame: torch.Tensor, dst: int, tag: int) -> None:
        self._links, self._work, self._frame, self.peer, self.tag = links, work, frame, dst, tag

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def wait(self, timeout: timedelta | None = None) -> None:
        self._links._wait(self._work, self.peer, FrameLabel(f"{self._links.group.rank}->{self.peer}",
                                                            f"send tag {self.tag}"), timeout)


class PendingRecv:
    """A posted sealed receive; :meth:`wait` verifies the message and writes the tensor."""

    def __init__(self, links: "SealedPeerLinks", work, frame: torch.Tensor, out: torch.Tensor,
                 src: int | None, tag: int) -> None:
        self._links, self._work, self._frame, self._out = links, work, frame, out
        self.tag = tag
        self.peer = src
        #: The bytes the message held (at most the receive's), once it has been verified.
        self.nbytes: int | None = None
        self._arrived, self._arrival = False, threading.Lock()
        # From a named source the counter is taken now, in posting order.
        self._open = links._open_job(src, tag, frame, out) if src is not None else None

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def wait(self, timeout: timedelta | None = None) -> int:
        """Wait, verify and write the received tensor; returns the sender's rank."""
        self._arrive(timeout)
        if self._open is None:
            self._links._take_anysource_counters(self)
        n = LENGTH.unpack_from(self._frame.numpy())[0]
        self._open(n, self._links._aad(self.peer, self._links.group.rank, self.tag, n))
        self.nbytes = n
        self._links.counters.add_message(sealed=False)
        return self.peer

    def _arrive(self, timeout: timedelta | None) -> None:
        """Wait for the message, once: a second wait on gloo's receive waits for another."""
        with self._arrival:
            if not self._arrived:
                src = "any" if self.peer is None else str(self.peer)
                self._links._wait(self._work, -1 if self.peer is None else self.peer,
                                  FrameLabel(f"{src}->{self._links.group.rank}", f"recv tag {self.tag}"), timeout)
                self._arrived = True

    def _take_counter(self) -> None:
        """A completed receive from any rank: its sender's next counter (posting order:
        :meth:`SealedPeerLinks._take_anysource_counters`)."""
        src = self._work.source_rank()
        if not (0 <= src < self._links.group.world_size) or src == self._links.group.rank:
            raise PeerTimeoutError(f"a receive from any rank reported sender {src}")
        self.peer = src
        self._open = self._links._open_job(src, self.tag, self._frame, self._out)


class SealedPeerLinks:
    """Sealed ``send``/``recv`` between the ranks of ``group`` over ``transport``."""

    def __init__(self, group: Endpoint, transport: Transport) -> None:
        if group.secret is None:
            raise ConfigError("sealed point-to-point messages need the group's key material")
        self.group = group
        self.transport = transport
        self.counters = CryptoCounters()
        self._tx: dict[tuple[int, int], LinkChannel] = {}
        self._rx: dict[tuple[int, int], LinkChannel] = {}
        self._lock = threading.Lock()
        # Per tag, the receives from any rank not yet given a counter, in posting order.
        self._anysource: dict[int, list[PendingRecv]] = {}
        self._anysource_lock = threading.Lock()

    def _channel(self, table: dict, src: int, dst: int, tag: int) -> LinkChannel:
        key = (dst if table is self._tx else src, tag)
        with self._lock:
            ch = table.get(key)
            if ch is None:
                g = self.group
                secret = derive_purpose_key(g.secret, g.session_id, f"p2p/{src}->{dst}/tag/{tag}")
                # No device pads: a message is host memory, its length known on arrival.
                ch = LinkChannel(secret, link_id(src, dst), f"{src}->{dst} tag {tag}", counters=self.counters,
                                 recorder=g.recorder, **{**g.settings.channel_options(), "pad_budget": 0})
                table[key] = ch
            return ch

    def _aad(self, src: int, dst: int, tag: int, nbytes: int) -> bytes:
        # No dtype: the bytes are the tensor's, read by the receive as its own (gloo's wire).
        return FrameContext(self.group.session_id, tag & ((1 << 64) - 1), Op.SEND_RECV, Phase.NONE, 0, 0,
                            src, dst, nbytes, "").pack()

    def _wait(self, work, peer: int, label: FrameLabel, timeout: timedelta | None) -> None:
        """The transport's bounded wait, or one bounded by the caller's ``timeout``."""
        if timeout is None:
            self.transport.wait(work, peer, label)
            return
        try:
            work.wait(gloo_timeout(timeout.total_seconds()))
        except RuntimeError:
            raise PeerTimeoutError(f"rank {self.group.rank}: {label}: no answer within "
                                   f"{timeout.total_seconds():g}s", label=label) from None

    def _check_peer(self, peer: int, what: str) -> None:
        n = self.group.world_size
        if not 0 <= peer < n or peer == self.group.rank:
            raise ConfigError(f"{what}: rank {peer} is not another rank of this group of {n}")

    def _open_job(self, src: int, tag: int, frame: torch.Tensor, out: torch.Tensor):
        """Take the next counter of ``src``'s stream on ``tag`` for the message ``frame``
        will hold: a job ``(n, aad)`` that opens its ``n`` bytes into ``out``."""
        ch = self._channel(self._rx, src, self.group.rank, tag)
        return ch.open_prefix_job(frame.numpy()[LENGTH.size:], out.numpy(), collective=f"recv tag {tag}", step=0)

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> PendingSend:
        """Seal ``tensor`` for ``dst`` now and post it."""
        self._check_peer(dst, "send")
        plain = _plain(tensor, "send")
        n = plain.numel()
        frame = torch.empty(LENGTH.size + n + TAG_BYTES, dtype=torch.uint8)
        LENGTH.pack_into(frame.numpy(), 0, n)
        ch = self._channel(self._tx, self.group.rank, dst, tag)
        ch.seal(plain.numpy(), frame.numpy()[LENGTH.size:], self._aad(self.group.rank, dst, tag, n))
        self.counters.add_message(sealed=True)
        return PendingSend(self, self.transport.isend(frame, dst, tag), frame, dst, tag)

    def irecv(self, tensor: torch.Tensor, src: int | None, tag: int = 0) -> PendingRecv:
        """Post a receive into ``tensor`` from ``src`` (None: from any rank)."""
        if src is not None:
            self._check_peer(src, "recv")
        out = _plain(tensor, "recv")
        frame = torch.empty(LENGTH.size + out.numel() + TAG_BYTES, dtype=torch.uint8)
        if src is None:
            with self._anysource_lock:
                try:
                    work = self.transport.pg.recv_anysource([frame], tag)
                except RuntimeError as e:
                    raise self.transport.peer_failed(e, "cannot receive from any rank") from None
                pending = PendingRecv(self, work, frame, out, src, tag)
                self._anysource.setdefault(tag, []).append(pending)
            return pending
        work = self.transport.irecv(frame, src, tag)
        return PendingRecv(self, work, frame, out, src, tag)

    def _take_anysource_counters(self, done: PendingRecv) -> None:
        """Give ``done`` (a completed receive from any rank) and every receive from any
        rank posted before it on its tag their senders' counters, in posting order: gloo
        completes them in that order, so the earlier ones have their messages already
        (their waits are then immediate)."""
        with self._anysource_lock:
            if done._open is not None:       # given one already, by a later receive's wait
                return
            # Every receive from any rank without a counter is in its tag's queue, posted
            # order; counters are given here only, under this lock.
            queue = self._anysource[done.tag]
            while True:
                first = queue[0]
                first._arrive(None)
                first._take_counter()
                queue.pop(0)                 # after: a wait that failed leaves the order as it was
                if first is done:
                    return
