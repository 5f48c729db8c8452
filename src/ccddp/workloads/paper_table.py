"""The paper's setup per workload: Table I (dataset, category, per-device batch) and the
all-reduce counts of Fig. 6. Data only, so that every workload module can read it
(:mod:`ccddp.workloads.paper` adds the FLOP counts, which need the registry).
"""

from __future__ import annotations

from typing import Any

#: Table I (dataset, category, per-device batch) and Fig. 6 (all-reduces per iteration,
#: given in the text only for GraphSAGE, BERT-Large and GPT2-XL).
PAPER: dict[str, dict[str, Any]] = {
    "graphsage": {"category": "GCN", "dataset": "OGBN-Products", "batch_size": 1024,
                  "fig6_allreduces": 2, "fanouts": [15, 10, 5]},
    "resnet50": {"category": "CNN", "dataset": "ImageNet", "batch_size": 1024,
                 "fig6_allreduces": None, "image_size": 224},
    "resnet101": {"category": "CNN", "dataset": "ImageNet", "batch_size": 1024,
                  "fig6_allreduces": None, "image_size": 224},
    "bert-base": {"category": "NLP (Encoder)", "dataset": "GLUE", "batch_size": 128,
                  "fig6_allreduces": None, "seq_len": 128},
    "bert-large": {"category": "NLP (Encoder)", "dataset": "GLUE", "batch_size": 128,
                   "fig6_allreduces": 38, "seq_len": 128},
    "gpt2-large": {"category": "LLM (Decoder)", "dataset": "CrowS-Pairs", "batch_size": 1,
                   "fig6_allreduces": None, "seq_len": 1024},
    "gpt2-xl": {"category": "LLM (Decoder)", "dataset": "CrowS-Pairs", "batch_size": 1,
                "fig6_allreduces": 142, "seq_len": 1024},
}
