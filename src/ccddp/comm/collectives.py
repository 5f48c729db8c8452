"""The engine's collectives: ``run_all_reduce``, ``run_reduce_scatter``, ``run_all_gather``,
``run_broadcast`` (and the in-place reduce-scatter the trust-domain hierarchy uses).

Invariant: they take checked input -- a flat, contiguous CPU tensor, a reduction defined for
its dtype, sizes that fit the group -- which the ccddp backend makes sure of once, before it
queues the op; nothing here checks it again. The settings of the
:class:`~ccddp.comm.endpoint.Endpoint` they run on pick the schedule: ``ring`` (unsealed
ring over P2P, the trust-domain hierarchy's inside a domain), ``secure-naive`` (the
paper's emulation) or ``secure`` (pipelined segments); and the algorithm: ``ring`` or
``tree``. Reductions (SUM, or any :class:`~ccddp.comm.reduce.Reduction`)
run in place; results equal ``dist.all_reduce`` up to summation order.

With each secure collective each rank sends its ring neighbours a sealed descriptor (op,
element count, dtype, settings), in the same round trip as the data: ranks that call
different collectives fail at once with a :class:`ConfigError` that says what differs,
instead of with a failed tag (see :class:`_Descriptors`).

Example::

    settings, transport = CommSettings(impl="secure"), Transport.open(None, 60)
    group = Endpoint(establish(transport, settings, GroupSecret.from_env()), transport)
    grads = torch.randn(1 << 20)
    run_all_reduce(group, grads, Reduction.SUM)   # every hop AES-256-GCM sealed and verified

The path from ``dist.all_reduce`` to here and on to the wire: :mod:`ccddp.comm.endpoint`.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import struct
import weakref

import torch

from ccddp.comm import probe
from ccddp.comm.endpoint import Endpoint
from ccddp.comm.naive import run_naive
from ccddp.comm.pipeline import dtype_name, run_pipelined
from ccddp.comm.plan import Step, chain_broadcast_plan, chunk_bounds, exchange_plan, ring_plan
from ccddp.comm.reduce import Reduction
from ccddp.comm.tree import run_tree_allreduce, tree_links
from ccddp.crypto.aad import DTYPE_NAME_BYTES, FrameContext, Op, Phase, dtype_field
from ccddp.crypto.channel import MAX_FRAME_BYTES, TAG_BYTES
from ccddp.errors import ConfigError, FrameLabel, PeerTimeoutError, one_line

_DESC = struct.Struct(f">BBQ{DTYPE_NAME_BYTES}sIB16s")
# Which wire a collective's data takes: the one both ends must post on.
WIRES = ("gloo", "an ordered wire (NCCL)")


def _describe(g: Endpoint, op: Op, numel: int, dtype: str, root: int, reduction: Reduction,
              wire: int = 0) -> bytes:
    return _DESC.pack(int(op), int(reduction), numel, dtype_field(dtype), root, wire, g.settings_digest)


def _explain(blob: bytes) -> str:
    """A descriptor in words, for the error that says how two ranks' collectives differ.

    The peer's descriptor was authenticated before it gets here (it opened on the link
    from that peer), but a peer on another ccddp version may still name an op or a
    reduction this one does not know: those are shown as numbers, and a descriptor of
    another size as its length, so that explaining a mismatch never raises.
    """
    if len(blob) != _DESC.size:
        return f"a descriptor of {len(blob)} bytes (another ccddp version?)"
    op, reduction, numel, dtype, root, wire, _ = _DESC.unpack(blob)
    name = one_line(dtype.rstrip(b"\0").decode(errors="replace"))
    try:
        op_name = Op(op).name.lower()
    except ValueError:
        op_name = f"op {op}"
    try:
        red = Reduction(reduction).name
    except ValueError:
        red = str(reduction)
    return f"{op_name} of {numel} {name} elements (root {root}, {red}) over {_wire_name(blob)}"


def _wire_name(blob: bytes) -> str:
    """The wire a (well-sized) descriptor names, in words."""
    wire = _DESC.unpack(blob)[5]
    return WIRES[wire] if wire < len(WIRES) else f"wire {wire}"


class _Descriptors:
    """The sealed descriptor exchange of one collective, posted together with its data.

    Each rank sends its neighbours a sealed descriptor (on tag 0) and then, without
    waiting for theirs, posts the collective's data on a tag derived from its own
    descriptor (:func:`data_tag`). Ranks that call the same collective meet on the same
    tag, so the descriptor and the data travel in the same round trip; ranks that differ
    post their data on different tags, gloo never pairs those messages (so it never sees a
    frame of the wrong size, which it answers by aborting the process), and
    :meth:`verify` -- run before the first data receive is waited on, and again at the
    end -- raises the :class:`ConfigError` that says what differs. A tag is 31 bits of a
    keyed hash: two different descriptors share one with probability 2^-31, and then the
    data frames still fail their AAD check (or gloo stops on the size); none is accepted.
    """

    def __init__(self, g: Endpoint, seq: int, mine: bytes, send_to: list[int], recv_from: list[int]) -> None:
        self.g, self.seq, self.mine, self.recv_from = g, seq, mine, recv_from
        self.tag = data_tag(g, seq, mine)
        tr = g.transport
        self.frames = {p: torch.empty(len(mine) + TAG_BYTES, dtype=torch.uint8) for p in recv_from}
        if probe.ON:
            probe.stamp("descriptor: tag HMAC + buffers")
        self.works = {p: tr.irecv(self.frames[p], p) for p in recv_from}
        if probe.ON:
            probe.stamp("descriptor: irecv post")
        self.sends = []
        for p in send_to:
            frame = torch.empty(len(mine) + TAG_BYTES, dtype=torch.uint8)
            aad = FrameContext(g.session_id, seq, Op.DESCRIPTOR, Phase.NONE, 0, 0, g.rank, p, len(mine), "").pack()
            g.channels.tx(p).seal(mine, frame.numpy(), aad)
            g.counters.add_message(sealed=True, control=True)
            if probe.ON:
                probe.stamp("descriptor: seal")
            self.sends.append((tr.isend(frame, p), p))
        self.done = False

    def verify(self) -> None:
        """Wait for the neighbours' descriptors and compare (once; later calls return)."""
        if self.done:
            return
        self.done = True
        g, seq, mine, tr = self.g, self.seq, self.mine, self.g.transport
        mismatch = None
        for p in self.recv_from:
            tr.wait(self.works[p], p, FrameLabel(f"{p}->{g.rank}", f"descriptor#{seq}", 0))
            theirs = bytearray(len(mine))
            aad = FrameContext(g.session_id, seq, Op.DESCRIPTOR, Phase.NONE, 0, 0, p, g.rank, len(mine), "").pack()
            g.channels.rx(p).open(self.frames[p].numpy(), theirs, aad, collective=f"descriptor#{seq}", step=0)
            g.counters.add_message(sealed=False, control=True)
            if bytes(theirs) != mine:
                mismatch = _differs(g, seq, p, bytes(theirs), mine)
                break
        # Our own descriptors are delivered even when we stop: the neighbours then say what
        # differs instead of timing out on a sender that exited.
        for w, p in self.sends:
            try:
                tr.wait(w, p, FrameLabel(f"{g.rank}->{p}", f"descriptor#{seq}", 0))
            except PeerTimeoutError:
                if mismatch is None:
                    raise
        if mismatch is not None:
            raise mismatch


def _differs(g: Endpoint, seq: int, p: int, theirs: bytes, mine: bytes) -> ConfigError:
    """The error that says how rank ``p``'s descriptor ``theirs`` differs from ours."""
    if theirs[-16:] != mine[-16:]:
        return ConfigError(f"rank {p} and rank {g.rank} use different collective settings")
    if _only_wire_differs(theirs, mine):
        return ConfigError(
            f"collective #{seq}: rank {p} sends its frames over {_wire_name(theirs)}, rank "
            f"{g.rank} over {_wire_name(mine)}: with the NCCL device wire, every rank needs the same "
            "placement for CUDA tensors (CommSettings.placement)")
    return ConfigError(f"collective #{seq} differs between ranks: rank {p} called "
                       f"{_explain(theirs)}, rank {g.rank} called {_explain(mine)}")


def _only_wire_differs(a: bytes, b: bytes) -> bool:
    """Two descriptors of one collective whose data takes different wires."""
    if len(a) != _DESC.size or len(b) != _DESC.size:
        return False
    x, y = list(_DESC.unpack(a)), list(_DESC.unpack(b))
    return x[5] != y[5] and x[:5] + x[6:] == y[:5] + y[6:]


# Per group, HMAC-SHA256 under its tag key with the key schedule done once (each tag copies
# it); held no longer than the group (weak keys).
_TAG_MACS: "weakref.WeakKeyDictionary[Endpoint, object]" = weakref.WeakKeyDictionary()


def data_tag(g: Endpoint, seq: int, descriptor: bytes) -> int:
    """The gloo tag (1 .. 2^31-1) of collective ``seq``'s data: a keyed hash of its
    descriptor, so only ranks that agree on the collective pair up their messages."""
    base = _TAG_MACS.get(g)
    if base is None:
        base = _TAG_MACS[g] = hmac.new(g.tag_key, digestmod=hashlib.sha256)
    mac = base.copy()
    mac.update(seq.to_bytes(8, "big") + descriptor)
    return 1 + int.from_bytes(mac.digest()[:8], "big") % ((1 << 31) - 2)


@functools.lru_cache(maxsize=256)
def _ring_plan(rank: int, n: int, numel: int, phase: str, bounds: tuple | None) -> tuple[Step, ...]:
    """``ring_plan``, kept (see ``pipeline._frames``): steps are frozen."""
    return tuple(ring_plan(rank, n, numel, phase, list(bounds) if bounds is not None else None))


def _plan(rank: int, n: int, numel: int, phase: str, bounds=None) -> tuple[Step, ...]:
    return _ring_plan(rank, n, numel, phase, tuple(bounds) if bounds is not None else None)


class _Unchecked:
    """Settings that run without descriptors: data on tag 0, nothing to verify."""

    tag = 0

    def verify(self) -> None:
        pass


def _exchange(g: Endpoint, seq: int, op: Op, numel: int, dtype: str, root: int,
              send_to: list[int], recv_from: list[int],
              reduction: Reduction = Reduction.SUM, wire: int = 0) -> _Descriptors | _Unchecked:
    """Post the descriptor exchange, if these settings run with one (``wire``: the index
    in :data:`WIRES` of the wire the data takes)."""
    s = g.settings
    if not (s.secure and s.check_descriptors):
        return _Unchecked()
    return _Descriptors(g, seq, _describe(g, op, numel, dtype, root, reduction, wire), send_to, recv_from)


def _run_ring(g: Endpoint, flat: torch.Tensor, steps: list[Step], op: Op, root: int = 0,
              reduction: Reduction = Reduction.SUM) -> None:
    if not steps:
        return  # a one-rank group: nothing to send, the result is already in place
    if probe.ON:
        probe.stamp("engine: dispatch + ring plan")
    s = g.settings
    seq = g.next_seq()
    # Device frames of the sealed pipeline take the group's ordered wire, if it has one.
    wire = g.transport.ordered_for(flat.device) if s.impl == "secure" else None
    desc = _exchange(g, seq, op, flat.numel(), dtype_name(flat), root,
                     sorted({st.send_peer for st in steps if st.send_peer is not None}),
                     sorted({st.recv_peer for st in steps if st.recv_peer is not None}), reduction,
                     wire=0 if wire is None else 1)
    if probe.ON:
        probe.stamp("descriptor: isend post")
    if s.impl == "secure-naive":
        run_naive(g, flat, steps, op, seq, tag=desc.tag, gate=desc.verify, reduction=reduction)
    else:
        seg = None if (s.tag == "message" and s.secure) else s.segment_bytes
        run_pipelined(g, flat, steps, op, seq, secure=s.secure, seg_bytes=seg,
                      group_key=s.allgather == "group-key", tag=desc.tag, gate=desc.verify, reduction=reduction,
                      wire=wire)
    desc.verify()  # a rank that received no data (broadcast root) checks here
    if probe.ON:
        probe.stamp("descriptor: final verify")


#: The largest all-reduce (bytes) a two-rank group runs as one sealed exchange
#: (:func:`~ccddp.comm.plan.exchange_plan`) instead of the ring's two steps (issue 42).
EXCHANGE_MAX_BYTES = 1 << 20


def exchanges(group: Endpoint, flat: torch.Tensor) -> bool:
    """Whether ``group`` all-reduces ``flat`` in one exchange: two ranks, the pipelined
    sealed schedule, at most :data:`EXCHANGE_MAX_BYTES`. One round trip instead of two
    (each ~0.3 ms of gloo rendezvous on a busy 2-core machine), one seal and one open
    instead of two each, the same bytes on the wire and through AES-GCM. Both ranks decide
    alike (the size is in the descriptor, the schedule in its op), and a rank that decided
    otherwise (another version) posts its data on another tag and fails the descriptor
    check with what differs, never pairing frames of different sizes."""
    s = group.settings
    return (group.world_size == 2 and s.impl == "secure" and s.algorithm == "ring"
            and flat.numel() * flat.element_size() <= EXCHANGE_MAX_BYTES)


# -- the two-rank exchange, prepared once per shape (issue 42) ------------------------------
# A small sealed all-reduce's cost is per-op Python, not AES-GCM: building the descriptor,
# its buffers and AADs, the pipeline's frame specs, arena views, send slots and jobs. The
# exchange is one frame each way, so its fixed parts are kept per shape and the op runs
# straight through: the same frames, AADs, nonces, tags and counters as the generic pipeline
# (a rank on either path pairs with a rank on the other), in the same order.

#: Frame buffers of an exchange of at most this many bytes are kept with its prepared op
#: (three of them); larger ones take the group's arena, as the pipeline does.
PREPARED_BUFFER_BYTES = 64 << 10
#: Prepared ops kept per group (least recently used dropped): at most
#: ``PREPARED_MAX * (3 * PREPARED_BUFFER_BYTES + ~300)`` bytes.
PREPARED_MAX = 64
#: Whether the exchange takes the prepared path (tests compare it with the pipeline's).
PREPARED = True

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
    """What a two-rank exchange all-reduce of one shape needs besides its seq and data: the
    descriptor, the AAD parts of its four frames, the descriptor's frames, and (small ops)
    the data frames and the buffer a received frame is opened into, with their numpy views.

    Nothing secret or per-op is kept: nonces are taken from the channels at each op, the
    tag and every AAD's seq are computed at each op; buffers are rewritten by every op.
    """

    __slots__ = ("key", "peer", "desc", "d_tx_aad", "d_rx_aad", "x_tx_aad", "x_rx_aad", "d_tx", "d_tx_np",
                 "d_rx", "d_rx_np", "theirs", "nbytes", "x_tx", "x_tx_np", "x_rx", "x_rx_np", "opened",
                 "opened_np", "tx_link", "rx_link", "plain_at", "plain_np")

    def __init__(self, g: Endpoint, numel: int, dtype: torch.dtype, reduction: Reduction) -> None:
        rank = g.rank
        (st,) = exchange_plan(rank, numel)
        peer = self.peer = st.send_peer
        name = str(dtype).removeprefix("torch.")
        self.key = (numel, dtype, reduction)
        self.desc = _describe(g, Op.EXCHANGE_ALL_REDUCE, numel, name, 0, reduction, 0)
        sid, dn = g.session_id, len(self.desc)
        self.d_tx_aad = _aad_parts(FrameContext(sid, 0, Op.DESCRIPTOR, Phase.NONE, 0, 0, rank, peer, dn, ""))
        self.d_rx_aad = _aad_parts(FrameContext(sid, 0, Op.DESCRIPTOR, Phase.NONE, 0, 0, peer, rank, dn, ""))
        n = self.nbytes = numel * dtype.itemsize
        self.x_tx_aad = _aad_parts(FrameContext(sid, 0, Op.EXCHANGE_ALL_REDUCE, st.phase, st.wire_step, 0,
                                                rank, peer, n, name))
        self.x_rx_aad = _aad_parts(FrameContext(sid, 0, Op.EXCHANGE_ALL_REDUCE, st.phase, st.wire_step, 0,
                                                peer, rank, n, name))
        self.d_tx = torch.empty(dn + TAG_BYTES, dtype=torch.uint8)
        self.d_rx = torch.empty(dn + TAG_BYTES, dtype=torch.uint8)
        self.d_tx_np, self.d_rx_np = self.d_tx.numpy(), self.d_rx.numpy()
        self.theirs = bytearray(dn)
        self.tx_link, self.rx_link = f"{rank}->{peer}", f"{peer}->{rank}"
        if n <= PREPARED_BUFFER_BYTES:
            # The open writes into a buffer of its own (pyca refuses overlapping buffers).
            self.x_tx = torch.empty(n + TAG_BYTES, dtype=torch.uint8)
            self.x_rx = torch.empty(n + TAG_BYTES, dtype=torch.uint8)
            opened = torch.empty(n, dtype=torch.uint8)
            self.opened = opened.view(dtype)
            self.x_tx_np, self.x_rx_np, self.opened_np = self.x_tx.numpy(), self.x_rx.numpy(), opened.numpy()
        else:
            self.x_tx = None
        # The numpy view of the last buffer reduced, by its address: the same address is the
        # same bytes (same size and dtype by the key; the view keeps that memory alive).
        self.plain_at, self.plain_np = -1, None

    def plain(self, flat: torch.Tensor):
        """``flat``'s bytes as the numpy array the channel seals from."""
        if self.x_tx is None:                      # a large buffer is not held
            return flat.view(torch.uint8).numpy()
        at = flat.data_ptr()
        if at != self.plain_at:
            self.plain_np = flat.view(torch.uint8).numpy()
            self.plain_at = at
        return self.plain_np


_PREPARED: "weakref.WeakKeyDictionary[Endpoint, dict]" = weakref.WeakKeyDictionary()


def prepared_exchange(g: Endpoint, flat: torch.Tensor, reduction: Reduction) -> PreparedExchange | None:
    """The prepared op of ``flat``'s shape, or None where the exchange takes the pipeline:
    no descriptors, frames not host memory that gloo carries as it is, several segments
    (a ``segment_bytes`` below the op's size), or nothing to send."""
    s = g.settings
    numel = flat.numel()
    if not (PREPARED and s.check_descriptors and numel and flat.device.type == "cpu"
            and "cpu" in g.transport.host_device_types):
        return None
    seg = MAX_FRAME_BYTES if s.tag == "message" else min(s.segment_bytes, MAX_FRAME_BYTES)
    if numel > max(1, seg // flat.element_size()):
        return None
    kept = _PREPARED.get(g)
    if kept is None:
        kept = _PREPARED[g] = {}
    key = (numel, flat.dtype, reduction)
    p = kept.pop(key, None)
    if p is None:
        p = PreparedExchange(g, numel, flat.dtype, reduction)
        if len(kept) >= PREPARED_MAX:
            del kept[next(iter(kept))]
    kept[key] = p            # most recently used last
    return p


def _run_prepared(g: Endpoint, flat: torch.Tensor, p: PreparedExchange, reduction: Reduction) -> None:
    """The exchange all-reduce of ``flat`` with its prepared op: what ``_run_ring`` with
    :func:`exchange_plan` does, frame for frame (module comment above)."""
    seq = g.next_seq()
    seq8 = seq.to_bytes(8, "big")
    tag = data_tag(g, seq, p.desc)
    peer, tr, counters = p.peer, g.transport, g.counters
    tx, rx = g.channels.tx(peer), g.channels.rx(peer)
    if p.x_tx is not None:
        x_tx, x_rx, opened = p.x_tx, p.x_rx, p.opened
        x_tx_np, x_rx_np, opened_np = p.x_tx_np, p.x_rx_np, p.opened_np
    else:
        # Larger frames live in the group's arena, as the pipeline's do.
        n = p.nbytes
        x_tx, x_rx, opened_u8 = (g.arena.take("tx", n + TAG_BYTES), g.arena.take("rx", n + TAG_BYTES),
                                 g.arena.take("opened", n))
        opened = opened_u8.view(flat.dtype)
        x_tx_np, x_rx_np, opened_np = x_tx.numpy(), x_rx.numpy(), opened_u8.numpy()
    if probe.ON:
        probe.stamp("exchange: prepared op, data tag")
    # The descriptor's receive and send first, then the data's, as the pipeline posts them;
    # each channel's counters in the pipeline's order (descriptor, then data).
    d_recv = tr.irecv(p.d_rx, peer)
    if probe.ON:
        probe.stamp("exchange: descriptor irecv post")
    h, t = p.d_tx_aad
    tx.seal(p.desc, p.d_tx_np, h + seq8 + t)
    counters.add_message(sealed=True, control=True)
    if probe.ON:
        probe.stamp("exchange: descriptor seal")
    d_send = tr.isend(p.d_tx, peer)
    if probe.ON:
        probe.stamp("exchange: descriptor isend post")
    x_recv = tr.irecv(x_rx, peer, tag)
    if probe.ON:
        probe.stamp("exchange: data irecv post")
    counters.add_message(sealed=True)
    h, t = p.x_tx_aad
    tx.seal(p.plain(flat), x_tx_np, h + seq8 + t)
    if probe.ON:
        probe.stamp("exchange: data seal")
    x_send = tr.isend(x_tx, peer, tag)
    if probe.ON:
        probe.stamp("exchange: data isend post")
    # The peer's descriptor: opened and compared before its data is waited for.
    where = f"descriptor#{seq}"
    tr.wait(d_recv, peer, FrameLabel(p.rx_link, where, 0))
    if probe.ON:
        probe.stamp("wait: peer's descriptor")
    h, t = p.d_rx_aad
    theirs = p.theirs
    rx.open(p.d_rx_np, theirs, h + seq8 + t, collective=where, step=0)
    counters.add_message(sealed=False, control=True)
    mismatch = None if theirs == p.desc else _differs(g, seq, peer, bytes(theirs), p.desc)
    try:
        tr.wait(d_send, peer, FrameLabel(p.tx_link, where, 0))
    except PeerTimeoutError:
        if mismatch is None:
            raise
    if mismatch is not None:
        raise mismatch
    if probe.ON:
        probe.stamp("exchange: descriptor open + compare")
    where = f"exchange_all_reduce#{seq}"
    tr.wait(x_recv, peer, FrameLabel(p.rx_link, where, 0, 0))
    if probe.ON:
        probe.stamp("wait: data frame")
    # Authenticated before use: a frame that fails leaves ``opened`` zeroed and raises
    # before the reduce, so ``flat`` is untouched.
    counters.add_message(sealed=False)
    h, t = p.x_rx_aad
    rx.open(x_rx_np, opened_np, h + seq8 + t, collective=where, step=0, segment=0)
    reduction.combine(flat, opened)
    if probe.ON:
        probe.stamp("exchange: open + reduce")
    tr.wait(x_send, peer, FrameLabel(p.tx_link, where))
    if probe.ON:
        probe.stamp("wait: send completions")


# -- the engine: input already checked ---------------------------------------------------
# ``flat`` is a 1-D contiguous CPU tensor, the reduction defined for its dtype, the group's
# settings secure (or the plaintext ring): what the ccddp backend has made sure of before it
# calls these, so a sealed op pays for no second round of checks.

def run_all_reduce(group: Endpoint, flat: torch.Tensor, reduction: Reduction, *, exchange: bool = True) -> None:
    """Reduce ``flat`` over the group in place (the sealed ring or tree; a two-rank group's
    small one in one exchange unless ``exchange`` is False: every rank must pass the same)."""
    s = group.settings
    if s.algorithm == "tree":
        seq = group.next_seq()
        parent, children = tree_links(group.rank, group.world_size)
        peers = children + ([parent] if parent is not None else [])
        desc = _exchange(group, seq, Op.TREE_ALL_REDUCE, flat.numel(), dtype_name(flat), 0, peers, peers, reduction)
        seg = None if (s.tag == "message" or s.impl == "secure-naive") else s.segment_bytes
        run_tree_allreduce(group, flat, seq, secure=s.secure, seg_bytes=seg, tag=desc.tag, gate=desc.verify,
                           reduction=reduction)
        desc.verify()
    elif exchange and exchanges(group, flat):
        group.counters.add_exchange()
        p = prepared_exchange(group, flat, reduction)
        if p is not None:
            if probe.ON:
                probe.stamp("engine: dispatch")
            _run_prepared(group, flat, p, reduction)
        else:
            _run_ring(group, flat, exchange_plan(group.rank, flat.numel()), Op.EXCHANGE_ALL_REDUCE,
                      reduction=reduction)
    else:
        _run_ring(group, flat, _plan(group.rank, group.world_size, flat.numel(), "all_reduce"), Op.ALL_REDUCE,
                  reduction=reduction)
    reduction.finish(flat, group.world_size)
    if probe.ON:
        probe.stamp("engine: finish")


def run_reduce_scatter(group: Endpoint, out: torch.Tensor, inp: torch.Tensor, reduction: Reduction,
                       bounds: list[tuple[int, int]] | None = None) -> None:
    """``out`` = the reduction of chunk ``rank`` of ``inp`` (``bounds``: the chunks, if
    uneven); ``inp`` is unchanged."""
    n = group.world_size
    work = inp.clone()
    _run_ring(group, work, _plan(group.rank, n, work.numel(), "reduce_scatter", bounds), Op.REDUCE_SCATTER,
              reduction=reduction)
    a, b = (bounds or chunk_bounds(work.numel(), n))[group.rank]
    out.copy_(work[a:b])
    reduction.finish(out, n)


def run_all_gather(group: Endpoint, out: torch.Tensor, inp: torch.Tensor | None,
                   bounds: list[tuple[int, int]] | None = None) -> None:
    """``out`` = every rank's ``inp`` in rank order (``bounds``: where each goes, if uneven;
    ``inp=None``: this rank's part is in ``out`` already)."""
    if inp is not None:
        a, b = (bounds or chunk_bounds(out.numel(), group.world_size))[group.rank]
        out[a:b].copy_(inp)
    _run_ring(group, out, _plan(group.rank, group.world_size, out.numel(), "all_gather", bounds), Op.ALL_GATHER)


def run_reduce_scatter_in_place(group: Endpoint, flat: torch.Tensor, reduction: Reduction,
                                bounds: list[tuple[int, int]] | None = None) -> None:
    """Chunk ``rank`` of ``flat`` (``bounds``: the chunks, if uneven) becomes its reduction
    over the group, in place (no ``finish``: what follows completes the all-reduce); the
    other chunks hold partial results."""
    _run_ring(group, flat, _plan(group.rank, group.world_size, flat.numel(), "reduce_scatter", bounds),
              Op.REDUCE_SCATTER, reduction=reduction)


def run_broadcast(group: Endpoint, flat: torch.Tensor, src: int) -> None:
    """Copy group rank ``src``'s ``flat`` to every rank (pipelined chain), in place."""
    _run_ring(group, flat, chain_broadcast_plan(group.rank, group.world_size, flat.numel(), src), Op.BROADCAST,
              root=src)
