"""The engine's collectives: ``run_all_reduce``, ``run_reduce_scatter``, ``run_all_gather``,
``run_broadcast`` (and the in-place reduce-scatter the trust-domain hierarchy uses).

Invariant: they take checked input -- a flat, contiguous CPU or CUDA tensor, a reduction defined for
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
instead of with a failed tag (:mod:`ccddp.comm.descriptors`). A two-rank group's small
all-reduce runs as one prepared exchange, and its small all-gather and reduce-scatter (one
ring step, one frame each way) as one prepared op (:mod:`ccddp.comm.prepared`).

Example::

    settings, transport = CommSettings(impl="secure"), Transport.open(None, 60)
    group = Endpoint(establish(transport, settings, GroupSecret.from_env()), transport)
    grads = torch.randn(1 << 20)
    run_all_reduce(group, grads, Reduction.SUM)   # every hop AES-256-GCM sealed and verified

The path from ``dist.all_reduce`` to here and on to the wire: :mod:`ccddp.comm.endpoint`.
"""

from __future__ import annotations

import functools

import torch

from ccddp.comm import probe
from ccddp.comm.descriptors import post_descriptors
from ccddp.comm.endpoint import Endpoint
from ccddp.comm.naive import run_naive
from ccddp.comm.pipeline import dtype_name, run_pipelined
from ccddp.comm.plan import Step, chain_broadcast_plan, chunk_bounds, exchange_plan, ring_plan
from ccddp.comm.prepared import prepared_exchange, prepared_ring, run_prepared
from ccddp.comm.reduce import Reduction
from ccddp.comm.tree import run_tree_allreduce, tree_links
from ccddp.crypto.aad import Op


@functools.lru_cache(maxsize=256)
def _ring_plan(rank: int, n: int, numel: int, phase: str, bounds: tuple | None) -> tuple[Step, ...]:
    """``ring_plan``, kept (see ``pipeline._frames``): steps are frozen."""
    return tuple(ring_plan(rank, n, numel, phase, list(bounds) if bounds is not None else None))


def _plan(rank: int, n: int, numel: int, phase: str, bounds=None) -> tuple[Step, ...]:
    return _ring_plan(rank, n, numel, phase, tuple(bounds) if bounds is not None else None)


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
    desc = post_descriptors(g, seq, op, flat.numel(), dtype_name(flat), root,
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
        desc = post_descriptors(group, seq, Op.TREE_ALL_REDUCE, flat.numel(), dtype_name(flat), 0, peers, peers, reduction)
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
            run_prepared(group, flat, p, reduction)
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
    p = (prepared_ring(group, Op.REDUCE_SCATTER, inp, reduction, bounds)
         if n == 2 and out.untyped_storage().data_ptr() != inp.untyped_storage().data_ptr() else None)
    if p is not None:
        # One frame each way: ``inp`` is read, not reduced into, so it needs no copy.
        if probe.ON:
            probe.stamp("engine: dispatch")
        run_prepared(group, inp, p, reduction, into=out)
        reduction.finish(out, n)
        return
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
    p = prepared_ring(group, Op.ALL_GATHER, out, Reduction.SUM, bounds) if group.world_size == 2 else None
    if p is not None:
        if probe.ON:
            probe.stamp("engine: dispatch")
        run_prepared(group, out, p, Reduction.SUM)
        return
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
