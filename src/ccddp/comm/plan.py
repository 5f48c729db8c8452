"""Schedules as data: which chunk each rank sends and receives at each ring step.

Chunk ``c`` of a buffer of ``numel`` elements is ``chunk_bounds(numel, n)[c]``; lengths
need not divide by ``n``. Reduce-scatter leaves rank ``r`` owning the sum of chunk ``r``
(as ``torch.distributed.reduce_scatter``), and all-gather starts from it, so the
all-reduce plan is the two concatenated and the chunk sent at step ``s`` is always the
chunk received at step ``s-1``: segments flow from one step to the next, across phases.

Example::

    steps = ring_plan(rank=0, n=4, numel=1 << 20, phase="all_reduce")
    [(s.send_chunk, s.recv_chunk, s.action) for s in steps]
"""

from __future__ import annotations

from dataclasses import dataclass

from ccddp.crypto.aad import Phase


def sized_bounds(sizes: list[int]) -> list[tuple[int, int]]:
    """Contiguous chunks of the given lengths (uneven all-gather and reduce-scatter)."""
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


def chunk_bounds(numel: int, n: int) -> list[tuple[int, int]]:
    """Split ``numel`` elements into ``n`` contiguous chunks, the first ``numel % n`` one longer."""
    base, extra = divmod(numel, n)
    bounds, start = [], 0
    for c in range(n):
        end = start + base + (1 if c < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def segment_bounds(start: int, end: int, seg_elems: int | None) -> list[tuple[int, int]]:
    """Cut ``[start, end)`` into segments of ``seg_elems`` elements (always at least one,
    possibly empty, so both ends agree on a frame even for an empty chunk)."""
    if seg_elems is None or end - start <= seg_elems:
        return [(start, end)]
    return [(s, min(s + seg_elems, end)) for s in range(start, end, seg_elems)]


@dataclass(frozen=True)
class Step:
    """One step of a schedule for this rank.

    ``send_region``/``recv_region`` are element ranges (or None); ``action`` says what a
    received segment does to its region: ``reduce`` (add) or ``copy``.
    ``wire_step`` is the step number both ends of a frame put in its AAD.
    """

    index: int
    phase: Phase
    send_peer: int | None
    recv_peer: int | None
    send_region: tuple[int, int] | None
    recv_region: tuple[int, int] | None
    action: str
    wire_step: int
    send_chunk: int | None = None
    recv_chunk: int | None = None


def ring_plan(rank: int, n: int, numel: int, phase: str,
              bounds: list[tuple[int, int]] | None = None) -> list[Step]:
    """Steps of a ring ``reduce_scatter``, ``all_gather`` or ``all_reduce`` (both);
    chunk ``c`` is ``bounds[c]`` (default: :func:`chunk_bounds`)."""
    bounds = bounds or chunk_bounds(numel, n)
    nxt, prev = (rank + 1) % n, (rank - 1) % n
    steps: list[Step] = []
    if phase in ("reduce_scatter", "all_reduce"):
        for s in range(n - 1):
            sc, rc = (rank - s - 1) % n, (rank - s - 2) % n
            steps.append(Step(len(steps), Phase.REDUCE_SCATTER, nxt, prev, bounds[sc], bounds[rc],
                              "reduce", len(steps), sc, rc))
    if phase in ("all_gather", "all_reduce"):
        for s in range(n - 1):
            sc, rc = (rank - s) % n, (rank - s - 1) % n
            steps.append(Step(len(steps), Phase.ALL_GATHER, nxt, prev, bounds[sc], bounds[rc],
                              "copy", len(steps), sc, rc))
    if phase not in ("reduce_scatter", "all_gather", "all_reduce"):
        raise ValueError(phase)
    return steps


def exchange_plan(rank: int, numel: int) -> list[Step]:
    """The all-reduce of a two-rank group in one step: each rank sends its whole buffer to
    the other and reduces what it receives into its own.

    Both ranks then hold ``mine (op) theirs`` with the operands swapped; every reduction
    ccddp runs (sum, product, min, max, bitwise) is commutative element by element in IEEE
    arithmetic, so the two results are bit-identical -- what the ring's all-gather phase
    otherwise guarantees. It sends the bytes the ring sends (a whole buffer per rank, in
    one frame instead of two halves), seals and opens as many bytes, in one round trip
    instead of two. The step sends the region it reduces into: the seal must be done
    before the reduce starts (the pipeline runs such a schedule on the calling thread).
    """
    peer = 1 - rank
    region = (0, numel)
    return [Step(0, Phase.EXCHANGE, peer, peer, region, region, "reduce", 0, rank, peer)]


def chain_broadcast_plan(rank: int, n: int, numel: int, root: int) -> list[Step]:
    """Pipelined chain broadcast: root -> root+1 -> ... ; each rank forwards segments as
    they arrive. Two steps per rank: receive from the previous rank, send to the next."""
    pos = (rank - root) % n
    prev, nxt = (rank - 1) % n, (rank + 1) % n
    region = (0, numel)
    recv = Step(0, Phase.BROADCAST, None, prev if pos > 0 else None, None,
                region if pos > 0 else None, "copy", 0)
    send = Step(1, Phase.BROADCAST, nxt if pos < n - 1 else None, None,
                region if pos < n - 1 else None, None, "copy", 0)
    return [recv, send]
