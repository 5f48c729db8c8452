"""All-reduce (and broadcast) over trust domains: plaintext inside a domain, sealed only
across domains.

With ``k`` shards (the smallest domain's size, :attr:`DomainMap.shards`), the buffer is cut
into ``k`` chunks, and rank ``l`` of every domain (its local index) holds shard ``l``:

1. inside each domain, in plaintext on its loopback-bound links, a reduce-scatter leaves
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

Example::

    hierarchical_all_reduce(links, flat, Reduction.SUM)   # links: the backend's DomainLinks
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ccddp.comm.collectives import run_all_gather, run_all_reduce, run_broadcast, run_reduce_scatter_in_place
from ccddp.comm.domains import DomainMap
from ccddp.comm.group import SecureGroup
from ccddp.comm.plan import chunk_bounds, sized_bounds
from ccddp.comm.reduce import Reduction


@dataclass
class DomainLinks:
    """What a rank needs for the hierarchical schedule: the map, its rank, its domain's
    plaintext group (the engine's unsealed ring, ``impl="ring"``, on a bare gloo backend
    over the domain's ranks bound to loopback), and the sealed group of its shard's ring
    across domains (None when it holds no shard, or when there is one domain)."""

    map: DomainMap
    rank: int
    local: SecureGroup
    cross: SecureGroup | None

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
    # Phase 1: this rank's shard, reduced over its domain (in plaintext, on loopback).
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

