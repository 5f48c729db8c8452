"""Neighbour sampling for GraphSAGE mini-batches, in the format of PyG's NeighborLoader.

``torch_geometric.loader.NeighborLoader`` needs ``pyg-lib`` or ``torch-sparse``
(compiled extensions with no wheel for this torch build), so this module does the same
job in plain torch: for each hop it samples up to ``fanout`` distinct in-neighbours
(without replacement, like NeighborLoader's default) of the nodes discovered in the
previous hop, relabels nodes locally with the seed nodes first, and returns an
``edge_index`` whose messages flow neighbour -> target, so ``model(x, edge_index)[:B]``
are the seeds' outputs exactly as with NeighborLoader.

Example::

    from ccddp.workloads.graphdata import synthetic_products
    from ccddp.workloads.sampler import sample_neighbors

    g = synthetic_products(seed=0, num_nodes=5_000)
    n_id, edge_index = sample_neighbors(g.rowptr, g.col, g.train_idx[:32], [15, 10, 5])
    # n_id[:32] are the seeds; edge_index indexes into n_id
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _sample_hop(rowptr: torch.Tensor, col: torch.Tensor, frontier: torch.Tensor,
                fanout: int, gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions of frontier nodes, sampled neighbours) for one hop."""
    start = rowptr[frontier]
    deg = rowptr[frontier + 1] - start
    if fanout < 0:  # -1 = all neighbours, as in PyG
        fanout = int(deg.max()) if deg.numel() else 0
    # Every edge of every frontier node, tagged with its frontier position.
    owner = torch.repeat_interleave(torch.arange(frontier.numel()), deg)
    offset = torch.arange(owner.numel()) - torch.repeat_interleave(torch.cumsum(deg, 0) - deg, deg)
    big = deg[owner] > fanout
    if bool(big.any()):
        # Uniform sample without replacement per node: random keys, sort within each
        # owner, keep the first `fanout`. Small-degree nodes keep all their edges.
        keys = torch.rand(owner.numel(), generator=gen, dtype=torch.float64) + owner.to(torch.float64)
        perm = torch.argsort(keys)
        rank_in_owner = torch.empty_like(perm)
        rank_in_owner[perm] = offset  # offsets are 0..deg-1 per owner, as is sorted rank
        keep = rank_in_owner < fanout
        owner, offset = owner[keep], offset[keep]
    return owner, col[start[owner] + offset]


def sample_neighbors(rowptr: torch.Tensor, col: torch.Tensor, seeds: torch.Tensor,
                     fanouts: Sequence[int], generator: torch.Generator | None = None,
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-hop neighbour sample around ``seeds``.

    Args:
        rowptr, col: CSR of in-neighbours (node ``v``'s are ``col[rowptr[v]:rowptr[v+1]]``).
        seeds: global ids of the mini-batch's target nodes (distinct).
        fanouts: neighbours per node per hop, e.g. ``[15, 10, 5]``; ``-1`` takes all.
        generator: source of randomness (deterministic sampling).

    Returns:
        ``n_id`` (global ids, seeds first, then nodes in order of discovery by hop) and
        ``edge_index`` [2, E] in local ids, row 0 = neighbour (source), row 1 = target.
    """
    num_nodes = rowptr.numel() - 1
    local = torch.full((num_nodes,), -1, dtype=torch.long)
    local[seeds] = torch.arange(seeds.numel())
    n_ids = [seeds]
    count = seeds.numel()
    frontier = seeds
    srcs, dsts = [], []
    for fanout in fanouts:
        if frontier.numel() == 0:
            break
        owner, nbr = _sample_hop(rowptr, col, frontier, int(fanout), generator)
        fresh = torch.unique(nbr[local[nbr] < 0])
        local[fresh] = torch.arange(count, count + fresh.numel())
        count += fresh.numel()
        n_ids.append(fresh)
        srcs.append(local[nbr])
        dsts.append(local[frontier[owner]])
        frontier = fresh
    n_id = torch.cat(n_ids)
    if srcs:
        edge_index = torch.stack([torch.cat(srcs), torch.cat(dsts)])
    else:
        edge_index = torch.empty((2, 0), dtype=torch.long)
    return n_id, edge_index
