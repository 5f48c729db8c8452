"""GraphSAGE on an OGBN-products-like graph (paper Table I: GCN, batch 1024).

The model is PyTorch Geometric's ``torch_geometric.nn.models.GraphSAGE`` (``SAGEConv``
layers, mean aggregation, ReLU, dropout 0.5) with products' 100 input features and 47
classes, 3 layers, trained on mini-batches of seed nodes with sampled neighbourhoods
(fanouts 15/10/5, as in PyG's ``ogbn_products_sage`` example).

Hidden width 512, not the 256 of PyG's products examples: with 256 the model has 232,895
parameters, 0.93 MB of fp32 gradients, which fits DDP's 1 MiB first bucket -> ONE
all-reduce per iteration, while the paper's Fig. 6 measured TWO for GraphSAGE. Width 512
(675,887 parameters, 2.7 MB) gives DDP's own bucketing two buckets, as the paper saw.
Pass ``hidden_channels=256`` for the PyG example's model.

Example::

    from ccddp.workloads import get_workload

    wl = get_workload("graphsage", size="tiny")
    model = wl.build_model()
    batch = wl.make_batch(step=0, rank=1, world_size=2)  # x, edge_index, y, n_id
    loss = wl.loss(model, batch)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ccddp.errors import ConfigError
from ccddp.workloads.base import Workload, _check_position, generator, int_setting
from ccddp.workloads.graphdata import PRODUCTS_NUM_CLASSES, PRODUCTS_NUM_FEATURES, synthetic_products
from ccddp.workloads.sampler import sample_neighbors


class GraphSAGEWorkload(Workload):
    """Node classification with GraphSAGE over sampled neighbourhoods."""

    family = "graph"
    PRESETS: Mapping[str, Mapping[str, Any]] = {
        "default": {
            # Seed nodes per rank (paper: 1024). Three hops around 128 seeds already reach
            # ~20k nodes / 60k edges of this graph; one fwd+bwd is ~3 s on one core.
            "batch_size": 128,
            "fanouts": (15, 10, 5),
            "dtype": "float32",
            "seed": 0,
            "hidden_channels": 512,
            "num_layers": 3,
            "num_features": PRODUCTS_NUM_FEATURES,
            "num_classes": PRODUCTS_NUM_CLASSES,
            # 2.45M nodes in products; 50k at its average degree builds in ~1 s.
            "num_nodes": 50_000,
            "avg_degree": 50.5,
        },
        "tiny": {
            "batch_size": 16,
            "fanouts": (5, 3),
            "dtype": "float32",
            "seed": 0,
            "hidden_channels": 16,
            "num_layers": 2,
            "num_features": PRODUCTS_NUM_FEATURES,
            "num_classes": PRODUCTS_NUM_CLASSES,
            "num_nodes": 2_000,
            "avg_degree": 10.0,
        },
    }

    def _validate(self) -> None:
        s = self.settings
        try:
            s["fanouts"] = tuple(int(f) for f in s["fanouts"])
        except (TypeError, ValueError):
            raise ConfigError(f"fanouts must be a list of integers, got {s['fanouts']!r}") from None
        if any(f == 0 or f < -1 for f in s["fanouts"]):
            raise ConfigError(f"fanouts must be positive (or -1 for all), got {list(s['fanouts'])}")
        int_setting(s, "num_layers", 1)
        if len(s["fanouts"]) != s["num_layers"]:
            raise ConfigError(f"need one fanout per layer: {len(s['fanouts'])} fanouts for "
                              f"{s['num_layers']} layers")
        int_setting(s, "num_nodes", 100)

    def _create_model(self) -> torch.nn.Module:
        from ccddp.workloads import pyg

        graph_sage = pyg.load("torch_geometric.nn.models").GraphSAGE
        s = self.settings
        return graph_sage(in_channels=int(s["num_features"]), hidden_channels=int(s["hidden_channels"]),
                          num_layers=int(s["num_layers"]), out_channels=int(s["num_classes"]),
                          dropout=0.5)

    def graph(self):
        """The synthetic graph of this workload's seed (built once per process)."""
        s = self.settings
        return synthetic_products(self.seed, int(s["num_nodes"]), float(s["avg_degree"]),
                                  int(s["num_features"]), int(s["num_classes"]))

    def make_batch(self, step: int, rank: int = 0, world_size: int = 1) -> dict[str, torch.Tensor]:
        """Seeds drawn from this rank's partition of the training nodes (as PyG's DDP
        examples split ``train_idx`` by rank), then a neighbour sample around them.

        Keys: ``x`` [n, F] features of the sampled nodes, ``edge_index`` [2, E] local,
        ``y`` [B] labels of the seeds (the first B nodes), ``n_id`` [n] global ids.
        """
        _check_position(step, rank, world_size)
        g = self.graph()
        part = g.train_idx.tensor_split(world_size)[rank]
        if part.numel() == 0:
            raise ConfigError(f"rank {rank} has no training nodes; increase num_nodes")
        gen = generator(self.seed, 0x73616765, step, rank, world_size)  # "sage"
        take = min(self.batch_size, part.numel())
        seeds = part[torch.randperm(part.numel(), generator=gen)[:take]]
        n_id, edge_index = sample_neighbors(g.rowptr, g.col, seeds, self.settings["fanouts"], gen)
        return {
            "x": g.x[n_id].to(self.param_dtype),
            "edge_index": edge_index,
            "y": g.y[seeds],
            "n_id": n_id,
        }

    def loss(self, model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        out = model(batch["x"], batch["edge_index"])[: batch["y"].numel()]
        return torch.nn.functional.cross_entropy(out.float(), batch["y"])
