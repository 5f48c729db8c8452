"""Two-rank collectives of one frame each way, prepared once per shape (issue 42).

A small sealed op's cost is per-op Python, not AES-GCM: building the descriptor, its
buffers and AADs, the pipeline's frame specs, arena views, send slots and jobs. A two-rank
all-reduce of at most :data:`~ccddp.comm.collectives.EXCHANGE_MAX_BYTES` is one frame each
way (:func:`~ccddp.comm.plan.exchange_plan`), and so is a two-rank all-gather or
reduce-scatter whose chunks fit one segment (:func:`~ccddp.comm.plan.ring_plan` is one step
at two ranks: FSDP2's traffic): their fixed parts are kept per shape (op, element count,
dtype, reduction, chunk bounds) and the op runs straight through.

The data frame of an op of at most :data:`~ccddp.comm.descriptors.FOLDED_DATA_MAX` (1 MiB)
each way travels in its descriptor's message (issue 42): one gloo message each way instead
of two, the round trip the descriptor used to cost. The message is the
sealed descriptor followed by the sealed data frame, on tag 0; its descriptor names the
wire :data:`~ccddp.comm.descriptors.FOLDED`, so a peer that sends that op's data apart
(the pipeline, a device tensor) fails the descriptor check saying so. Every tag-0 receive
has room for such a message (:data:`~ccddp.comm.descriptors.TAG0_CAPACITY`: gloo takes a
shorter message into a longer receive, never a longer one), and a receiver opens the
descriptor first, whatever follows it.

Invariants:

- the same frames, AADs, nonces and crypto counters as the generic pipeline, in the same
  order: a descriptor then a data frame per link direction, each sealed with its channel's
  next nonce (tests compare them); ops larger than
  :data:`~ccddp.comm.descriptors.FOLDED_DATA_MAX` send them as the pipeline does, the data
  on its own tag (a rank on either path pairs with a rank on the other);
- nothing secret or per-op is kept: nonces are taken from the link channels at each op,
  the data tag and every AAD's sequence number are computed at each op;
- the descriptor check's guarantee (:mod:`ccddp.comm.descriptors`): the peer's descriptor
  is opened and compared before its data is waited for;
- authenticated before use: a reduced frame opens into a buffer of its own (pyca refuses
  overlapping buffers) and is reduced only after its tag verified; on failure that buffer
  is zeroed and ``flat`` (and a reduce-scatter's output) untouched. An all-gather's frame
  opens straight into its region of the output (which no frame overlaps); on failure the
  channel zeroes that region;
- bounded: at most :data:`PREPARED_MAX` shapes per endpoint (least recently used
  dropped), each holding at most two buffers of :data:`PREPARED_BUFFER_BYTES` (the
  message it sends, the buffer it opens into); larger ops take the group's arena, and
  every prepared op of an endpoint receives into one buffer of
  :data:`~ccddp.comm.descriptors.TAG0_CAPACITY` (ops run one at a time, as the arena's
  frames assume).

Example::

    p = prepared_exchange(endpoint, flat, Reduction.SUM)    # None: the pipeline runs it
    if p is not None:
        run_prepared(endpoint, flat, p, Reduction.SUM)
    p = prepared_ring(endpoint, Op.ALL_GATHER, out, Reduction.SUM, None)   # two ranks
    if p is not None:
        run_prepared(endpoint, out, p, Reduction.SUM)
"""

from __future__ import annotations

import ctypes
import struct
import weakref

import numpy as np
import torch

from ccddp.comm import probe
from ccddp.comm.descriptors import DESC_FRAME, FOLDED, FOLDED_DATA_MAX, TAG0_CAPACITY, data_tag, describe, differs
from ccddp.comm.endpoint import Endpoint
from ccddp.comm.plan import Step, exchange_plan, ring_plan
from ccddp.comm.reduce import Reduction
from ccddp.crypto.aad import FrameContext, Op, Phase
from ccddp.crypto.channel import MAX_FRAME_BYTES, TAG_BYTES
from ccddp.errors import FrameLabel, PeerTimeoutError

#: The send and open buffers of an op of at most this many bytes are kept with its
#: prepared op; larger ones take the group's arena, as the pipeline's do.
PREPARED_BUFFER_BYTES = 64 << 10
#: Prepared ops kept per group (least recently used dropped): at most
#: ``PREPARED_MAX * (2 * PREPARED_BUFFER_BYTES + ~500)`` bytes, and one receive.
PREPARED_MAX = 64
#: Whether the exchange, all-gather and reduce-scatter take the prepared path (tests
#: compare it with the pipeline's).
PREPARED = True
#: Numpy views of buffers kept per prepared op, by address (the oldest dropped).
VIEWS_KEPT = 8
#: The ops a prepared op runs, and the ring phase of the last two.
_PHASES = {Op.ALL_GATHER: "all_gather", Op.REDUCE_SCATTER: "reduce_scatter"}

# The AAD is ``session (16) || seq (8) || the rest``: a prepared op keeps the parts around
# the seq and patches the seq in (checked here once, and against FrameContext.pack in tests).
_SEQ_AT = struct.calcsize(">16s")
assert FrameContext(bytes(16), 0x0102030405060708, Op.DESCRIPTOR, Phase.NONE, 0, 0, 0, 0, 0, "").pack()[
    _SEQ_AT:_SEQ_AT + 8] == bytes(range(1, 9))


def _aad_parts(ctx: FrameContext) -> tuple[bytes, bytes]:
    """``(head, tail)``: ``head + seq.to_bytes(8, "big") + tail`` is ``ctx``'s AAD with that seq."""
    raw = ctx.pack()
    return raw[:_SEQ_AT], raw[_SEQ_AT + 8:]


class PreparedExchange:
    """What a two-rank one-step op of one shape needs besides its seq and data: the
    descriptor, the step's send and receive regions and action, the AAD parts of its four
    frames, numpy views of the endpoint's tag-0 receive, and (ops of at most
    :data:`PREPARED_BUFFER_BYTES`) the message it sends and the buffer a received frame
    that is reduced is opened into, with their numpy views.

    Nothing secret or per-op is kept: nonces are taken from the channels at each op, the
    tag and every AAD's seq are computed at each op; buffers are rewritten by every op.
    """

    __slots__ = ("key", "op", "peer", "desc", "folded", "kept", "d_tx_aad", "d_rx_aad", "x_tx_aad", "x_rx_aad", "d_tx", "d_tx_np",
                 "d_rx", "d_rx_np", "theirs", "nbytes", "tx_nbytes", "send_region", "recv_region", "action", "where_name",
                 "x_tx_np", "x_rx_np", "opened", "opened_np", "tx_link", "rx_link", "whole",
                 "_views")

    def __init__(self, g: Endpoint, numel: int, dtype: torch.dtype, reduction: Reduction,
                 op: Op = Op.EXCHANGE_ALL_REDUCE, bounds: tuple | None = None) -> None:
        rank = g.rank
        if op is Op.EXCHANGE_ALL_REDUCE:
            (st,) = exchange_plan(rank, numel)
        else:
            (st,) = ring_plan(rank, 2, numel, _PHASES[op], list(bounds) if bounds is not None else None)
        st: Step
        peer = self.peer = st.send_peer
        name = str(dtype).removeprefix("torch.")
        self.key = (op, numel, dtype, reduction, bounds)
        self.op, self.where_name = op, op.name.lower()
        self.send_region, self.recv_region, self.action = st.send_region, st.recv_region, st.action
        self.whole = op is Op.EXCHANGE_ALL_REDUCE        # sends (and reduces) all of ``flat``
        isz = dtype.itemsize
        tx_n = self.tx_nbytes = (st.send_region[1] - st.send_region[0]) * isz
        n = self.nbytes = (st.recv_region[1] - st.recv_region[0]) * isz
        # Up to 1 MiB the data goes in its descriptor's message, a larger op's apart (the
        # descriptor _run_ring posts: root 0, gloo wire).
        self.folded = max(tx_n, n) <= FOLDED_DATA_MAX
        self.kept = max(tx_n, n) <= PREPARED_BUFFER_BYTES
        self.desc = describe(g, op, numel, name, 0, reduction, FOLDED if self.folded else 0)
        sid, dn = g.session_id, len(self.desc)
        self.d_tx_aad = _aad_parts(FrameContext(sid, 0, Op.DESCRIPTOR, Phase.NONE, 0, 0, rank, peer, dn, ""))
        self.d_rx_aad = _aad_parts(FrameContext(sid, 0, Op.DESCRIPTOR, Phase.NONE, 0, 0, peer, rank, dn, ""))
        self.x_tx_aad = _aad_parts(FrameContext(sid, 0, op, st.phase, st.wire_step, 0, rank, peer, tx_n, name))
        self.x_rx_aad = _aad_parts(FrameContext(sid, 0, op, st.phase, st.wire_step, 0, peer, rank, n, name))
        self.theirs = bytearray(dn)
        self.tx_link, self.rx_link = f"{rank}->{peer}", f"{peer}->{rank}"
        self.opened = self.opened_np = None
        # Every prepared op of this endpoint receives into its one tag-0 receive, with room
        # for any tag-0 message (a peer's other collective's too): the sealed descriptor
        # first, then (in one message) the data frame.
        self.d_rx, whole_rx = _tag0_receive(g)
        self.d_rx_np = whole_rx[:DESC_FRAME]
        self.x_rx_np = whole_rx[DESC_FRAME:DESC_FRAME + n + TAG_BYTES] if self.folded else None
        assert dn + TAG_BYTES == DESC_FRAME
        if self.folded and self.kept:
            # The message it sends: the sealed descriptor, then the sealed data frame.
            self.d_tx = torch.empty(DESC_FRAME + tx_n + TAG_BYTES, dtype=torch.uint8)
            whole_tx = self.d_tx.numpy()
            self.d_tx_np, self.x_tx_np = whole_tx[:DESC_FRAME], whole_tx[DESC_FRAME:]
            if self.action == "reduce":
                # The open writes into a buffer of its own (pyca refuses overlapping buffers).
                opened = torch.empty(n, dtype=torch.uint8)
                self.opened, self.opened_np = opened.view(dtype), opened.numpy()
        elif not self.folded:
            self.d_tx = torch.empty(DESC_FRAME, dtype=torch.uint8)
            self.d_tx_np = self.d_tx.numpy()
        else:
            self.d_tx = None                 # the arena's, per op
        # Numpy views of the buffers this op ran on, by address (see :meth:`views`).
        self._views: dict[int, tuple] = {}

    def views(self, flat: torch.Tensor) -> tuple:
        """``(send, recv)``: the bytes of ``flat``'s send region (what the channel seals)
        and, for a copy step, of its receive region (what the peer's frame opens into;
        else None), as numpy arrays.

        Kept by ``flat``'s address, and keeping nothing alive (an all-gather's output is
        FSDP's unsharded parameter, freed after use): a view is used only while a tensor of
        this op's size and dtype (the key) lies at its address, and is then that tensor's
        memory. A tensor that is not contiguous gets views made for the op."""
        if not flat.is_contiguous():
            a, b = self.send_region
            ra, rb = self.recv_region
            return (flat[a:b].view(torch.uint8).numpy(),
                    flat[ra:rb].view(torch.uint8).numpy() if self.action == "copy" else None)
        at = flat.data_ptr()
        got = self._views.get(at)
        if got is None:
            isz = flat.element_size()
            a, b = self.send_region
            ra, rb = self.recv_region
            got = (_unowned(at + a * isz, (b - a) * isz),
                   _unowned(at + ra * isz, (rb - ra) * isz) if self.action == "copy" else None)
            if len(self._views) >= VIEWS_KEPT:
                del self._views[next(iter(self._views))]
            self._views[at] = got
        return got


def _unowned(at: int, nbytes: int) -> np.ndarray:
    """A writable uint8 array over the ``nbytes`` at address ``at`` that keeps no memory alive."""
    return np.frombuffer((ctypes.c_uint8 * nbytes).from_address(at), dtype=np.uint8)


_PREPARED: "weakref.WeakKeyDictionary[Endpoint, dict]" = weakref.WeakKeyDictionary()
_TAG0_RX: "weakref.WeakKeyDictionary[Endpoint, tuple]" = weakref.WeakKeyDictionary()


def _tag0_receive(g: Endpoint) -> tuple[torch.Tensor, np.ndarray]:
    """The endpoint's tag-0 receive of its prepared ops, and its numpy view."""
    got = _TAG0_RX.get(g)
    if got is None:
        rx = torch.empty(TAG0_CAPACITY, dtype=torch.uint8)
        got = _TAG0_RX[g] = (rx, rx.numpy())
    return got


def prepared_exchange(g: Endpoint, flat: torch.Tensor, reduction: Reduction) -> PreparedExchange | None:
    """The prepared op of ``flat``'s shape, or None where the exchange takes the pipeline:
    no descriptors, frames not host memory that gloo carries as it is, several segments
    (a ``segment_bytes`` below the op's size), or nothing to send."""
    if not _one_frame(g, flat, flat.numel()):
        return None
    return _kept(g, (Op.EXCHANGE_ALL_REDUCE, flat.numel(), flat.dtype, reduction, None))


def _one_frame(g: Endpoint, flat: torch.Tensor, longest: int) -> bool:
    """Whether ``flat``'s op may take the prepared path: descriptors on, host memory that
    gloo carries as it is, something to send, and at most ``longest`` elements per frame
    (one segment)."""
    s = g.settings
    if not (PREPARED and s.check_descriptors and flat.numel() and flat.device.type == "cpu"
            and "cpu" in g.transport.host_device_types):
        return False
    seg = MAX_FRAME_BYTES if s.tag == "message" else min(s.segment_bytes, MAX_FRAME_BYTES)
    return longest <= max(1, seg // flat.element_size())


def _kept(g: Endpoint, key: tuple) -> PreparedExchange:
    kept = _PREPARED.get(g)
    if kept is None:
        kept = _PREPARED[g] = {}
    p = kept.pop(key, None)
    if p is None:
        op, numel, dtype, reduction, bounds = key
        p = PreparedExchange(g, numel, dtype, reduction, op, bounds)
        if len(kept) >= PREPARED_MAX:
            del kept[next(iter(kept))]
    kept[key] = p            # most recently used last
    return p


def prepared_ring(g: Endpoint, op: Op, flat: torch.Tensor, reduction: Reduction,
                  bounds: list[tuple[int, int]] | None) -> PreparedExchange | None:
    """The prepared op of a two-rank ring all-gather or reduce-scatter (``op``) of
    ``flat`` (the whole buffer: an all-gather's output, a reduce-scatter's input) with
    chunks ``bounds`` (None: even), or None where the pipeline runs it: not two ranks of
    the ``secure`` schedule, group-key all-gather, or not one host frame each way (as
    :func:`prepared_exchange`)."""
    s = g.settings
    if g.world_size != 2 or s.impl != "secure" or (op is Op.ALL_GATHER and s.allgather == "group-key"):
        return None
    numel = flat.numel()
    if bounds is None:
        longest = (numel + 1) // 2
    else:
        bounds = tuple(tuple(b) for b in bounds)
        longest = max(b - a for a, b in bounds)
    if not _one_frame(g, flat, longest):
        return None
    return _kept(g, (op, numel, flat.dtype, reduction, bounds))


def run_prepared(g: Endpoint, flat: torch.Tensor, p: PreparedExchange, reduction: Reduction,
                 into: torch.Tensor | None = None) -> None:
    """Op ``p`` of ``flat`` with its prepared frames: what ``_run_ring`` with the op's one
    step does, frame for frame (module comment above), its two frames in one message
    up to 1 MiB. The exchange all-reduces ``flat`` in place; an all-gather opens the peer's
    chunk into ``flat`` (its output); a reduce-scatter reads ``flat`` (its input,
    unchanged) and writes this rank's chunk, reduced, into ``into``."""
    seq = g.next_seq()
    seq8 = seq.to_bytes(8, "big")
    peer, tr, counters = p.peer, g.transport, g.counters
    tx, rx = g.channels.tx(peer), g.channels.rx(peer)
    x_rx_np, opened, opened_np = p.x_rx_np, p.opened, p.opened_np
    if p.kept:
        d_tx, d_tx_np, x_tx_np = p.d_tx, p.d_tx_np, p.x_tx_np
    else:
        # Larger frames live in the group's arena, as the pipeline's do.
        n = p.nbytes
        if p.folded:
            d_tx = g.arena.take("tx", DESC_FRAME + p.tx_nbytes + TAG_BYTES)
            whole_tx = d_tx.numpy()
            d_tx_np, x_tx_np = whole_tx[:DESC_FRAME], whole_tx[DESC_FRAME:]
        else:
            d_tx, d_tx_np = p.d_tx, p.d_tx_np
            x_tx, x_rx = g.arena.take("tx", p.tx_nbytes + TAG_BYTES), g.arena.take("rx", n + TAG_BYTES)
            x_tx_np, x_rx_np = x_tx.numpy(), x_rx.numpy()
        if p.action == "reduce":
            opened_u8 = g.arena.take("opened", n)
            opened, opened_np = opened_u8.view(flat.dtype), opened_u8.numpy()
    plain_np, region_np = p.views(flat)
    if p.action == "copy":
        # The frame opens straight into its region of the output (a buffer no frame
        # overlaps); a frame that fails leaves the region zeroed (the channel's open).
        opened_np = region_np
    if probe.ON:
        probe.stamp("exchange: prepared op")
    # The receives first, then the seals and sends; each channel's counters in the
    # pipeline's order (descriptor, then data).
    d_recv = tr.irecv(p.d_rx, peer)
    h, t = p.d_tx_aad
    tx.seal_host(p.desc, d_tx_np, h + seq8 + t)
    counters.add_message(sealed=True, control=True)
    if not p.folded:
        # Above 1 MiB: the descriptor goes now, the data on its own tag, as the pipeline's.
        tag = data_tag(g, seq, p.desc)
        d_send = tr.isend(d_tx, peer)
        x_recv = tr.irecv(x_rx, peer, tag)
    counters.add_message(sealed=True)
    h, t = p.x_tx_aad
    tx.seal_host(plain_np, x_tx_np, h + seq8 + t)
    if p.folded:
        d_send = x_send = tr.isend(d_tx, peer)         # the descriptor and the data frame
    else:
        x_send = tr.isend(x_tx, peer, tag)
    if probe.ON:
        probe.stamp("exchange: seal + post")
    # The peer's descriptor: opened and compared before its data is waited for (or, in one
    # message, opened).
    where = f"descriptor#{seq}"
    tr.wait(d_recv, peer, FrameLabel(p.rx_link, where, 0))
    if probe.ON:
        probe.stamp("wait: peer's descriptor")
    h, t = p.d_rx_aad
    theirs = p.theirs
    rx.open_host(p.d_rx_np, theirs, h + seq8 + t, collective=where, step=0)
    counters.add_message(sealed=False, control=True)
    mismatch = None if theirs == p.desc else differs(g, seq, peer, bytes(theirs), p.desc)
    if mismatch is not None or not p.folded:      # (one message: its send is waited for below)
        try:
            tr.wait(d_send, peer, FrameLabel(p.tx_link, where, 0))
        except PeerTimeoutError:
            if mismatch is None:
                raise
    if mismatch is not None:
        raise mismatch
    where = f"{p.where_name}#{seq}"
    if not p.folded:
        tr.wait(x_recv, peer, FrameLabel(p.rx_link, where, 0, 0))
    if probe.ON:
        probe.stamp("exchange: descriptor open + compare, data frame")
    # Authenticated before use: a frame that fails leaves ``opened`` zeroed and raises
    # before the reduce, so ``flat`` (and ``into``) is untouched. A folded message shorter
    # than this op's (a peer that sent less) leaves older bytes in the receive: they fail
    # the tag like any other.
    counters.add_message(sealed=False)
    h, t = p.x_rx_aad
    rx.open_host(x_rx_np, opened_np, h + seq8 + t, collective=where, step=0, segment=0)
    if p.action == "reduce":
        ra, rb = p.recv_region
        if into is None:
            reduction.combine(flat[ra:rb] if not p.whole else flat, opened)
        else:
            # The pipeline's ``work[ra:rb] (op)= opened``, then copied out: the same bits,
            # written into ``into`` in one pass.
            reduction.combine(flat[ra:rb], opened, out=into)
    if probe.ON:
        probe.stamp("exchange: open + reduce")
    tr.wait(x_send, peer, FrameLabel(p.tx_link, where))
    if probe.ON:
        probe.stamp("wait: send completions")
