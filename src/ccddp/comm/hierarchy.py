"""All-reduce over trust domains: plaintext inside a domain, sealed only across domains.

With ``k`` shards (the smallest domain's size, :attr:`DomainMap.shards`), the buffer is cut
into ``k`` chunks, and rank ``l`` of every domain (its local index) holds shard ``l``:

1. inside each domain, in plaintext on its loopback-bound links, a reduce-scatter leaves
   each rank ``l < k`` with its domain's reduction of shard ``l`` (a domain larger than
   ``k`` all-reduces instead, and its ranks ``>= k`` hold no shard);
2. across domains, the ranks holding shard ``l`` run a sealed all-reduce of it: one ring
   per shard, the engine's pipelined schedule (:func:`ccddp.comm.collectives.run_all_reduce`);
3. inside each domain, an all-gather of the shards gives every rank the whole result.

Each rank seals ``2(d-1)/d * S/k`` bytes of an ``S``-byte all-reduce over ``d`` domains,
against ``2(n-1)/n * S`` in the flat schedule. Phases 1 and 3 use gloo's own collectives
on the domain's links; chunks are padded to one width (the padding is never read). AVG
runs as SUM and is divided once at the end; every other reduction is applied in each phase
(all are associative and commutative; floating-point results differ from the flat
schedule's by summation order only).

Example::

    hierarchical_all_reduce(links, flat, Reduction.SUM)   # links: the backend's DomainLinks
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ccddp.comm.collectives import run_all_reduce
from ccddp.comm.domains import DomainMap
from ccddp.comm.group import SecureGroup
from ccddp.comm.plan import chunk_bounds
from ccddp.comm.reduce import Reduction
from ccddp.comm.transport import bounded


@dataclass
class DomainLinks:
    """What a rank needs for the hierarchical schedule: the map, its rank, the plaintext
    links of its domain (a bare gloo backend over the domain's ranks, bound to loopback),
    and the sealed group of its shard's ring across domains (None when it holds no shard,
    or when there is one domain)."""

    map: DomainMap
    rank: int
    local: dist.ProcessGroup
    cross: SecureGroup | None
    timeout_s: float

    @property
    def world_size(self) -> int:
        return sum(len(d) for d in self.map.domains)


def _torch_op(reduction: Reduction):
    return dist.ReduceOp.SUM if reduction == Reduction.AVG else getattr(dist.ReduceOp, reduction.name)


def hierarchical_all_reduce(links: DomainLinks, flat: torch.Tensor, reduction: Reduction) -> None:
    """Reduce the 1-D contiguous CPU tensor ``flat`` over the whole group, in place."""
    k = links.map.shards
    g = links.local.size()
    mine = links.local.rank()
    op = _torch_op(reduction)
    bounds = chunk_bounds(flat.numel(), k)
    width = max(b - a for a, b in bounds)
    # Phase 1: this rank's shard, reduced over its domain.
    if g == 1:
        shard = flat[bounds[0][0]:bounds[0][1]].clone()
    elif g == k:
        padded = torch.zeros(k * width, dtype=flat.dtype)
        for c, (a, b) in enumerate(bounds):
            padded[c * width:c * width + b - a].copy_(flat[a:b])
        shard = torch.empty(width, dtype=flat.dtype)
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = op
        bounded(links.local._reduce_scatter_base(shard, padded, opts), links.timeout_s)
        shard = shard[:bounds[mine][1] - bounds[mine][0]] if mine < k else shard[:0]
    else:
        whole = flat.clone()
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        bounded(links.local.allreduce([whole], opts), links.timeout_s)
        shard = whole[bounds[mine][0]:bounds[mine][1]].clone() if mine < k else whole[:0]
    # Phase 2: the shard across domains, sealed.
    if links.cross is not None and mine < k:
        run_all_reduce(links.cross, shard, Reduction.SUM if reduction == Reduction.AVG else reduction)
    # Phase 3: every shard to every rank of the domain.
    if g == 1:
        flat.copy_(shard)
    else:
        out = torch.empty(g * width, dtype=flat.dtype)
        contribution = torch.zeros(width, dtype=flat.dtype)
        contribution[:shard.numel()].copy_(shard)
        bounded(links.local._allgather_base(out, contribution), links.timeout_s)
        for c, (a, b) in enumerate(bounds):
            flat[a:b].copy_(out[c * width:c * width + b - a])
    reduction.finish(flat, links.world_size)
