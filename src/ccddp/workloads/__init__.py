"""The seven workloads of the paper's Table I, with synthetic data and DDP bucket plans.

Full-size architectures from maintained libraries (``transformers`` for ResNet, BERT and
GPT-2, PyTorch Geometric for GraphSAGE), random init, no downloads; data generated from a
seed with the originals' shapes. ``bucket_plan`` reproduces DDP's own gradient bucketing
(paper Fig. 6) and ``paper_setup`` gives the paper's batch sizes and FLOPs per sample.

Example::

    from ccddp.workloads import WORKLOADS, bucket_plan, get_workload, paper_setup

    wl = get_workload("bert-base", size="tiny", batch_size=4, seed=0)
    model = wl.build_model(device="cpu")
    batch = wl.make_batch(step=0, rank=0, world_size=2)
    wl.loss(model, batch).backward()
    wl.shapes                                  # everything used, for result files
    bucket_plan("bert-large").num_buckets      # 38 all-reduces per iteration
    paper_setup("gpt2-xl")["batch_size"]       # 1
"""

from ccddp.workloads.base import DTYPES, SIZES, Workload
from ccddp.workloads.bucketing import BucketPlan, bucket_plan
from ccddp.workloads.paper import PAPER, paper_setup
from ccddp.workloads.registry import WORKLOADS, get_workload

__all__ = [
    "DTYPES",
    "PAPER",
    "SIZES",
    "WORKLOADS",
    "BucketPlan",
    "Workload",
    "bucket_plan",
    "get_workload",
    "paper_setup",
]
