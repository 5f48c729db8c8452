"""The paper's setup per workload (Table I, Fig. 6) and forward FLOPs per sample.

A performance model turns these into compute time: ``batch_size *
train_flops_per_sample / flop_rate``. FLOPs count a multiply-add as 2 (so ResNet-50 at
224x224 is 8.18 GFLOP, torchvision's "4.09 GFLOPS" being multiply-adds).

How ``forward_flops_per_sample`` is obtained:

* ResNet, BERT, GPT-2: ``torch.utils.flop_counter.FlopCounterMode`` over one forward of
  the full architecture on the meta device (no memory, well under a second), at the
  paper's input shape. It counts matmuls, convolutions and attention, i.e.
  ~``2 * matmul_params * tokens + 4 * layers * tokens^2 * hidden`` for transformers;
  norms, activations and the loss are left out, as usual.
* GraphSAGE: the cost depends on the sampled subgraph, so a closed form over the
  tree-shaped sample of one seed (no overlap, an upper bound): ``n = 1 + f1 + f1*f2 +
  ...`` nodes and ``e = n - 1`` edges; each SAGEConv layer (all of it is applied to all
  ``n`` nodes, as PyG does) costs ``4 * n * d_in * d_out`` (two linear maps) ``+ e * d_in``
  (mean aggregation).

Backward is taken as twice the forward (``train = 3 * forward``), the usual estimate.

Assumed shapes the paper does not state: GLUE sequences padded to 128 tokens (the
``max_length`` default of Hugging Face's GLUE scripts), CrowS-Pairs in 1024-token
blocks (``run_clm``'s default block size for GPT-2, consistent with batch 1 filling an
H100), ImageNet at 224x224, products fanouts 15/10/5 (PyG's example).

Example::

    from ccddp.workloads import paper_setup

    p = paper_setup("resnet50")
    p["batch_size"], p["forward_flops_per_sample"]   # 1024, 8.18e9
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ccddp.workloads.paper_table import PAPER
from ccddp.workloads.registry import check_name, get_workload


def paper_setup(name: str) -> dict[str, Any]:
    """The paper's setting for workload ``name`` plus FLOPs per sample.

    Keys: ``workload``, ``category``, ``dataset``, ``batch_size`` (per device),
    ``fig6_allreduces`` (or None where the paper gives no number), the input shape
    (``seq_len`` / ``image_size`` / ``fanouts``), ``param_dtype`` (fp32),
    ``forward_flops_per_sample``, ``train_flops_per_sample`` and ``flops_method``.
    The FLOP counts are computed once per process (about a second for all seven).
    """
    check_name(name)
    out = {"workload": name, **PAPER[name], "param_dtype": "float32"}
    if "fanouts" in out:
        out["fanouts"] = list(out["fanouts"])
    fwd, method = _forward_flops(name)
    out["forward_flops_per_sample"] = fwd
    out["train_flops_per_sample"] = 3.0 * fwd
    out["flops_method"] = method
    return out


@functools.lru_cache(maxsize=None)
def _forward_flops(name: str) -> tuple[float, str]:
    from torch.utils.flop_counter import FlopCounterMode

    wl = get_workload(name)
    s = PAPER[name]
    if wl.family == "graph":
        return _sage_flops(wl.settings, s["fanouts"]), "formula: tree-shaped neighbour sample, upper bound"
    model = wl.build_model(device="meta")
    with torch.device("meta"):
        if wl.family == "vision":
            size = s["image_size"]
            inputs = {"pixel_values": torch.empty((1, 3, size, size), dtype=wl.param_dtype)}
        else:
            # No attention_mask: transformers inspects its values, which meta tensors lack;
            # it does not change the matmul count.
            inputs = {"input_ids": torch.zeros((1, s["seq_len"]), dtype=torch.long)}
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            model(**inputs)
    return float(counter.get_total_flops()), "torch.utils.flop_counter on the meta device"


def _sage_flops(settings: dict[str, Any], fanouts: list[int]) -> float:
    nodes = 1
    frontier = 1
    for f in fanouts:
        frontier *= f
        nodes += frontier
    edges = nodes - 1
    dims = [int(settings["num_features"])] + [int(settings["hidden_channels"])] * (
        int(settings["num_layers"]) - 1) + [int(settings["num_classes"])]
    return float(sum(4 * nodes * d_in * d_out + edges * d_in for d_in, d_out in zip(dims, dims[1:])))
