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
from ccddp.crypto.channel import TAG_BYTES
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
                if theirs[-16:] != mine[-16:]:
                    mismatch = ConfigError(f"rank {p} and rank {g.rank} use different collective settings")
                elif _only_wire_differs(bytes(theirs), mine):
                    mismatch = ConfigError(
                        f"collective #{seq}: rank {p} sends its frames over {_wire_name(bytes(theirs))}, rank "
                        f"{g.rank} over {_wire_name(mine)}: with the NCCL device wire, every rank needs the same "
                        "placement for CUDA tensors (CommSettings.placement)")
                else:
                    mismatch = ConfigError(f"collective #{seq} differs between ranks: rank {p} called "
                                           f"{_explain(bytes(theirs))}, rank {g.rank} called {_explain(mine)}")
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
        _run_ring(group, flat, exchange_plan(group.rank, flat.numel()), Op.EXCHANGE_ALL_REDUCE, reduction=reduction)
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
