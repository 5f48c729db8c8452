"""A synthetic graph shaped like OGBN-products, generated once per seed.

OGBN-products (Amazon co-purchase network): 2,449,029 nodes, 61,859,140 undirected
edges (average degree ~50 after symmetrisation), a heavy-tailed degree distribution,
100-dimensional node features (PCA of bag-of-words, so variance falls off across
dimensions), 47 product categories with very unequal sizes, strong homophily (co-bought
products share a category), and a small training split (8 %, by sales rank).

The generator reproduces those statistics at a scale this machine builds in about a
second: a Chung-Lu graph (endpoint probability proportional to a Pareto weight, giving
power-law degrees) in which a fraction ``homophily`` of edges stays inside the source's
class. Written by hand because no maintained library here makes such graphs without
extra compiled packages; the result is a ``torch_geometric.data.Data`` with CSR
adjacency attached for :mod:`ccddp.workloads.sampler`.

Example::

    from ccddp.workloads.graphdata import synthetic_products

    g = synthetic_products(seed=0, num_nodes=20_000)
    g.x.shape, g.num_classes  # (torch.Size([20000, 100]), 47)
"""

from __future__ import annotations

import functools

import torch

from ccddp.workloads.base import generator

PRODUCTS_NUM_FEATURES = 100
PRODUCTS_NUM_CLASSES = 47
PRODUCTS_AVG_DEGREE = 50.5
PRODUCTS_TRAIN_FRACTION = 0.08


@functools.lru_cache(maxsize=4)
def synthetic_products(seed: int, num_nodes: int, avg_degree: float = PRODUCTS_AVG_DEGREE,
                       num_features: int = PRODUCTS_NUM_FEATURES,
                       num_classes: int = PRODUCTS_NUM_CLASSES,
                       homophily: float = 0.8, degree_exponent: float = 2.1,
                       train_fraction: float = PRODUCTS_TRAIN_FRACTION):
    """Build (and cache) the graph for ``seed``; see the module docstring.

    Returns a ``torch_geometric.data.Data`` with ``x`` [N, F] float32, ``y`` [N] int64,
    ``edge_index`` [2, E] (both directions, no self-loops, no duplicates), ``rowptr`` /
    ``col`` (CSR of in-neighbours, for sampling), ``train_idx`` and ``num_classes``.
    Cached, so every rank and step of one process shares one copy; treat it as read-only.
    """
    from ccddp.workloads import pyg

    Data = pyg.load("torch_geometric.data").Data

    gen = generator(seed, 0x67726170, num_nodes)  # "grap"
    n = int(num_nodes)

    # Unequal category sizes (Zipf-like), as in products where a few categories dominate.
    class_p = 1.0 / torch.arange(1, num_classes + 1, dtype=torch.float64) ** 1.1
    y = torch.multinomial(class_p / class_p.sum(), n, replacement=True, generator=gen)

    # Pareto weights with tail exponent (degree_exponent - 1) give P(deg=k) ~ k^-degree_exponent.
    u = torch.rand(n, generator=gen, dtype=torch.float64).clamp_(min=1e-12)
    weight = u.pow(-1.0 / (degree_exponent - 1.0))
    weight = weight.clamp_(max=float(n) ** 0.5 * 4)  # cap hubs so no node links to most of the graph

    # Merging duplicate pairs (frequent between hubs) loses ~25 % of the draws at
    # products' density; drawing more keeps the final average degree near avg_degree.
    num_pairs = int(n * avg_degree / 2 * 1.3)
    # Weighted draws by inverse CDF (one searchsorted) rather than torch.multinomial
    # per class, which made this ~5x slower.
    order = torch.argsort(y, stable=True)
    cum = torch.cumsum(weight[order], 0)
    class_w = torch.zeros(num_classes, dtype=torch.float64).index_add_(0, y, weight)
    class_lo = torch.cumsum(class_w, 0) - class_w
    total = cum[-1]

    def draw(lo: torch.Tensor, width: torch.Tensor) -> torch.Tensor:
        u = torch.rand(lo.shape, generator=gen, dtype=torch.float64)
        pos = torch.searchsorted(cum, lo + u * width, right=True).clamp_(max=n - 1)
        return order[pos]

    zero = torch.zeros(num_pairs, dtype=torch.float64)
    src = draw(zero, total.expand(num_pairs))
    # A fraction `homophily` of edges stays inside the source's class, still by weight.
    same = torch.rand(num_pairs, generator=gen) < homophily
    cs = y[src]
    dst = torch.where(same, draw(class_lo[cs], class_w[cs]), draw(zero, total.expand(num_pairs)))

    keep = src != dst
    src, dst = src[keep], dst[keep]
    # Undirected: both directions, duplicates merged (coalesce by a single sort of keys).
    key = torch.unique(torch.cat([src * n + dst, dst * n + src]))
    row, col = key // n, key % n  # sorted by row, so it is already CSR order
    edge_index = torch.stack([col, row])  # messages flow col -> row: source first, as in PyG
    rowptr = torch.zeros(n + 1, dtype=torch.long)
    rowptr[1:] = torch.cumsum(torch.bincount(row, minlength=n), 0)

    # Class centroids plus noise, scaled by a PCA-like falling spectrum per dimension.
    centroids = torch.randn((num_classes, num_features), generator=gen)
    spectrum = 1.0 / torch.sqrt(torch.arange(1, num_features + 1, dtype=torch.float32))
    x = (0.6 * centroids[y] + torch.randn((n, num_features), generator=gen)) * spectrum

    num_train = max(1, int(round(n * train_fraction)))
    train_idx = torch.randperm(n, generator=gen)[:num_train].sort().values

    data = Data(x=x, y=y, edge_index=edge_index, num_nodes=n)
    data.rowptr = rowptr
    data.col = col
    data.train_idx = train_idx
    data.num_classes = num_classes
    return data
