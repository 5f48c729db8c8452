"""All-reduce, reduce-scatter (and broadcast) over trust domains: plaintext inside a domain,
sealed only across domains.

With ``k`` shards (the smallest domain's size, :attr:`DomainMap.shards`), the buffer is cut
into ``k`` chunks, and rank ``l`` of every domain (its local index) holds shard ``l``:

1. inside each domain, in plaintext on its local links (AF_UNIX, to ranks that proved they share the machine), a reduce-scatter leaves
   each rank ``l < k`` with its domain's reduction of shard ``l`` (in a domain larger than
   ``k``, ranks ``>= k`` hold an empty shard);
2. across domains, the ranks holding shard ``l`` run a sealed all-reduce of it: one ring
   per shard, the engine's pipelined schedule (:func:`ccddp.comm.collectives.run_all_reduce`);
3. inside each domain, an all-gather of the shards gives every rank the whole result.

Each rank seals ``2(d-1)/d * S/k`` bytes of an ``S``-byte all-reduce over ``d`` domains,
against ``2(n-1)/n * S`` in the flat schedule. Phases 1 and 3 are the engine's own ring,
unsealed (gloo's reduce-scatter and all-gather took 1-3x gloo's whole all-reduce on two
loopback ranks, BENCHMARKS.md), so shards of any size need no padding, and every phase
works in the buffer in place: no copy of it is made. AVG runs as SUM and is divided once
at the end; every other reduction is applied in each phase (all are associative and
commutative; floating-point results differ from the flat schedule's by summation order).

**Reduce-scatter** (every rank ``r`` ends with the reduction of chunk ``r`` of ``n`` equal
chunks of ``c`` elements) runs like the all-reduce's first two phases, with a sealed
reduce-scatter across domains in place of the all-reduce, on a reordered copy of the
input, so that each shard ring's reduce-scatter leaves every chunk where it belongs:

- chunk ``r`` travels in shard ``s(r) = l(r) if l(r) < k else l(r) mod k`` (``l(r)``: its
  local index), and within it in the region of ``r``'s domain; the work buffer holds
  shard 0, then 1, ..., and in each shard the region of domain 0, then 1, ..., each region
  its holder's own chunk first, then those of its domain's ranks ``>= k`` that it carries
  (:func:`scatter_layout`);
- phase 1 (plaintext, inside each domain): a reduce-scatter of the work buffer with local
  rank ``s`` owning shard ``s`` (ranks ``>= k``: nothing) leaves each holder with its
  domain's reduction of its shard;
- phase 2 (sealed, across domains): on shard ``s``'s ring, a reduce-scatter whose chunk
  ``i`` is domain ``i``'s region leaves each holder with the whole group's reduction of
  its region: its own chunk, and those of the ranks it carries;
- phase 3 (plaintext, inside each domain): a holder sends each rank it carries that
  rank's chunk (one hop, ``c`` elements; only in domains larger than ``k``).

Invariants: every chunk is reduced over every domain exactly once, in exactly one shard
ring, and reaches its owner; a holder seals its shard's size less its domain's region
(``(d-1) * c`` for equal domains of ``g``: the flat ring seals ``(n-1) * c``, about ``g``
times more); a rank ``>= k`` seals nothing. Every rank derives the same layout from the
map alone, so the frames of each ring line up. The work buffer is one copy of the input,
as the flat schedule's is (it reduces into a clone). At 64 MiB over 2 domains of 2 it took
0.85-0.93x the flat sealed ring's time (medians of paired ratios, BENCHMARKS.md).

Example::

    hierarchical_all_reduce(links, flat, Reduction.SUM)   # links: the backend's DomainLinks
    hierarchical_reduce_scatter(links, out, inp, Reduction.AVG)   # inp: n * out.numel() elements
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ccddp.comm.collectives import run_all_gather, run_all_reduce, run_broadcast, run_reduce_scatter_in_place
from ccddp.comm.domains import DomainMap
from ccddp.comm.endpoint import Endpoint
from ccddp.comm.plan import chunk_bounds, sized_bounds
from ccddp.comm.reduce import Reduction
from ccddp.errors import ConfigError, FrameLabel


@dataclass
class DomainLinks:
    """What a rank needs for the hierarchical schedule: the map, its rank, its domain's
    plaintext group (the engine's unsealed ring, ``impl="ring"``, on the domain's local
    links: AF_UNIX, to ranks that proved they share the machine), and the sealed group of
    its shard's ring
    across domains (None when it holds no shard, or when there is one domain)."""

    map: DomainMap
    rank: int
    local: Endpoint
    cross: Endpoint | None

    @property
    def world_size(self) -> int:
        return sum(len(d) for d in self.map.domains)


def hierarchical_all_reduce(links: DomainLinks, flat: torch.Tensor, reduction: Reduction) -> None:
    """Reduce the 1-D contiguous CPU tensor ``flat`` over the whole group, in place."""
    local, k = links.local, links.map.shards
    g, mine = local.world_size, local.rank
    # Shard c of k is local rank c's; a domain's ranks >= k (uneven domains) hold none.
    sizes = [b - a for a, b in chunk_bounds(flat.numel(), k)] + [0] * (g - k)
    bounds = sized_bounds(sizes)
    within = Reduction.SUM if reduction == Reduction.AVG else reduction   # AVG: divided once, at the end
    # All in place: each phase leaves in ``flat`` what the next one reads.
    # Phase 1: this rank's shard, reduced over its domain (in plaintext, on the domain's local links).
    if g > 1:
        run_reduce_scatter_in_place(local, flat, within, bounds)
    a, b = bounds[mine]
    # Phase 2: the shard across domains, sealed.
    if links.cross is not None and mine < k:
        run_all_reduce(links.cross, flat[a:b], within)
    # Phase 3: every shard to every rank of the domain.
    if g > 1:
        run_all_gather(local, flat, None, bounds)
    reduction.finish(flat, links.world_size)


def hierarchical_broadcast(links: DomainLinks, flat: torch.Tensor, root: int) -> None:
    """Group rank ``root``'s ``flat`` to every rank, in place: to the ranks of the root's
    domain in plaintext; shard ``l`` of ``k`` sealed, once, to rank ``l`` of every other
    domain (on shard ``l``'s ring across domains); then, inside every other domain, the
    shards to every rank in plaintext. Each shard holder seals ``S/k`` bytes (the flat
    chain: ``S`` at every rank but the last)."""
    m, local, k = links.map, links.local, links.map.shards
    g, mine = local.world_size, local.rank
    root_domain = m.domain_of(root)
    at_root = m.domain_of(links.rank) == root_domain
    bounds = sized_bounds([b - a for a, b in chunk_bounds(flat.numel(), k)] + [0] * (g - k))
    if at_root and g > 1:
        run_broadcast(local, flat, m.local_index(root))
    if links.cross is not None and mine < k:
        a, b = bounds[mine]
        run_broadcast(links.cross, flat[a:b], root_domain)   # the ring's ranks are domain indices
    if not at_root and g > 1:
        run_all_gather(local, flat, None, bounds)



def scatter_layout(m: DomainMap) -> list[list[list[int]]]:
    """``layout[s][i]``: the group ranks whose chunks travel in shard ``s`` in domain ``i``'s
    region, in order: domain ``i``'s holder of shard ``s``, then the ranks ``>= k`` of
    domain ``i`` it carries (local index ``l``, ``l mod k == s``).

    Example::

        scatter_layout(DomainMap.of([[0, 1, 2], [3, 4]], 5))   # [[[0, 2], [3]], [[1], [4]]]
    """
    k = m.shards
    return [[[d[l] for l in range(len(d)) if l == s or (l >= k and l % k == s)] for d in m.domains]
            for s in range(k)]


def hierarchical_reduce_scatter(links: DomainLinks, out: torch.Tensor, inp: torch.Tensor,
                                reduction: Reduction) -> None:
    """``out`` (1-D, contiguous, ``c`` elements) = the reduction over the whole group of
    chunk ``rank`` of ``inp`` (1-D, contiguous, ``n * c`` elements); ``inp`` is unchanged.
    The schedule is the module docstring's."""
    m, local, k = links.map, links.local, links.map.shards
    n, c = links.world_size, out.numel()
    if inp.numel() != n * c:
        raise ConfigError(f"reduce_scatter: input must hold world_size x output elements "
                          f"({inp.numel()} vs {n} x {c})")
    g, mine = local.world_size, local.rank
    d = m.domain_of(links.rank)
    layout = scatter_layout(m)
    # The work buffer: every chunk in layout order (the one copy the schedule makes).
    work = torch.cat([inp[r * c:(r + 1) * c] for shard in layout for owners in shard for r in owners])
    shard_bounds = sized_bounds([sum(len(o) for o in shard) * c for shard in layout] + [0] * (g - k))
    within = Reduction.SUM if reduction == Reduction.AVG else reduction   # AVG: divided once, at the end
    # Phase 1: this rank's shard, reduced over its domain (in plaintext, on the domain's local links).
    if g > 1:
        run_reduce_scatter_in_place(local, work, within, shard_bounds)
    if mine < k:
        a, b = shard_bounds[mine]
        regions = sized_bounds([len(owners) * c for owners in layout[mine]])
        # Phase 2: the shard across domains, sealed; this domain's region ends reduced.
        if links.cross is not None:
            run_reduce_scatter_in_place(links.cross, work[a:b], within, regions)
        start = a + regions[d][0]
        out.copy_(work[start:start + c])
        # Phase 3: the chunks of the ranks this one carries, to them (plaintext, on the domain's local links).
        _hand_over(local, [(m.local_index(r), work[start + j * c:start + (j + 1) * c])
                           for j, r in enumerate(layout[mine][d]) if j > 0])
    else:
        _take_over(local, mine % k, out)
    reduction.finish(out, n)


def _hand_over(local: Endpoint, parts: list[tuple[int, torch.Tensor]]) -> None:
    """Send each ``(local rank, chunk)`` of ``parts`` to its rank, in plaintext."""
    t = local.transport
    # gloo's point-to-point takes host memory only: a device chunk goes through a host copy.
    works = [(peer, t.isend(part.cpu().view(torch.uint8), peer)) for peer, part in parts if part.numel()]
    for peer, w in works:
        t.wait(w, peer, FrameLabel(f"{local.rank}->{peer}", "reduce_scatter hand-over", 2))


def _take_over(local: Endpoint, holder: int, out: torch.Tensor) -> None:
    """Receive this rank's chunk from local rank ``holder``, in plaintext."""
    if not out.numel():
        return
    # gloo receives into host bytes: a device tensor, or a one-element "contiguous" one
    # whose stride is not 1 (a column of a matrix), receives through a host buffer.
    frame = out if out.is_cpu and out.stride(0) == 1 else torch.empty(out.shape, dtype=out.dtype)
    t = local.transport
    t.wait(t.irecv(frame.view(torch.uint8), holder), holder,
           FrameLabel(f"{holder}->{local.rank}", "reduce_scatter hand-over", 2))
    if frame is not out:
        out.copy_(frame)
