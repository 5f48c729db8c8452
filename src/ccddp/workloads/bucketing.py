"""DDP's gradient buckets for a workload, computed by DDP's own code.

``DistributedDataParallel`` groups gradients into buckets and launches one all-reduce
per bucket (paper Fig. 6: "asynchronous all-reduces"); under CC every all-reduce costs
``4*(n-1)`` AES-GCM operations, so the bucket count drives the overhead. This module
calls the same function DDP calls, ``torch.distributed._compute_bucket_assignment_by_size``,
the way DDP uses it (torch 2.13, ``torch/nn/parallel/distributed.py`` and the C++
Reducer's ``rebuild_buckets``):

* parameters: ``module.named_modules()`` x ``named_parameters(recurse=False)`` with
  ``requires_grad``, shared tensors counted once (DDP's ``_build_params_for_reducer``);
* order (``order="reverse"``, the default): parameters reversed, DDP's own stand-in for
  the order gradients become ready in backward; buckets come back sorted in launch
  order. After iteration 0 the Reducer rebuilds the buckets from the order it actually
  saw, which ``order="ready"`` reproduces by tracing one backward on the meta device
  (byte-for-byte equal to DDP's ``rebuilt_bucket_sizes``; see the tests). Both give the
  same bucket COUNTS for all seven workloads; sizes differ by a few tensors, e.g. where
  ResNet's shortcut convolutions or BERT's embeddings fall;
* limits ``[first_bucket_bytes, bucket_bytes]``: ``bucket_cap_mb=None`` means 25 MiB
  buckets with a 1 MiB first bucket (``dist._DEFAULT_FIRST_BUCKET_BYTES``); a value sets
  both limits to ``bucket_cap_mb`` MiB.

Iteration 0 uses a single bucket holding every gradient (DDP cannot know the ready order
yet); the plan describes iterations 1 onwards. A bucket is closed once it reaches its
limit, so one tensor larger than the limit makes a bucket of its own.

Example::

    from ccddp.workloads import bucket_plan

    plan = bucket_plan("bert-large")          # meta device, a second
    plan.num_buckets                          # 38 (paper Fig. 6: 38)
    plan.bucket_bytes[:2]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ccddp.errors import ConfigError
from ccddp.workloads.base import Workload, dtype_name, parse_dtype, reducer_parameters

MIB = 1024 * 1024
DEFAULT_BUCKET_CAP_MB = 25  # DDP's _DEFAULT_BUCKET_CAP_MB


@dataclass(frozen=True)
class BucketPlan:
    """DDP buckets of one model, in launch order.

    Attributes:
        workload: workload name, or the module's class name.
        num_params: trainable scalars (shared tensors once).
        num_tensors: trainable parameter tensors.
        bucket_bytes: gradient bytes of each bucket, in DDP launch order.
        bucket_numel: scalars per bucket.
        bucket_params: parameter names per bucket (first name of a shared tensor).
        dtype: gradient dtype name (``"mixed"`` if parameters differ).
        bucket_cap_mb: the cap asked for (None = DDP's default).
        first_bucket_bytes, bucket_bytes_cap: the byte limits DDP applies.
        order: ``"reverse"`` or ``"ready"`` (how parameters were ordered).
    """

    workload: str
    num_params: int
    num_tensors: int
    bucket_bytes: list[int]
    bucket_numel: list[int]
    bucket_params: list[list[str]] = field(repr=False)
    dtype: str
    bucket_cap_mb: float | None
    first_bucket_bytes: int
    bucket_bytes_cap: int
    order: str = "reverse"

    @property
    def num_buckets(self) -> int:
        """All-reduce calls per iteration (after the first)."""
        return len(self.bucket_bytes)

    @property
    def total_bytes(self) -> int:
        return sum(self.bucket_bytes)

    def to_dict(self, with_params: bool = False) -> dict[str, Any]:
        """JSON-ready view; ``with_params`` adds the parameter names per bucket."""
        out: dict[str, Any] = {
            "workload": self.workload,
            "num_params": self.num_params,
            "num_tensors": self.num_tensors,
            "dtype": self.dtype,
            "bucket_cap_mb": self.bucket_cap_mb,
            "first_bucket_bytes": self.first_bucket_bytes,
            "bucket_bytes_cap": self.bucket_bytes_cap,
            "order": self.order,
            "num_buckets": self.num_buckets,
            "allreduces_first_iteration": 1,
            "total_bytes": self.total_bytes,
            "bucket_bytes": list(self.bucket_bytes),
            "bucket_numel": list(self.bucket_numel),
        }
        if with_params:
            out["bucket_params"] = [list(p) for p in self.bucket_params]
        return out


def bucket_limits(bucket_cap_mb: float | None) -> tuple[int, int]:
    """``(first_bucket_bytes, bucket_bytes_cap)`` as DDP derives them from ``bucket_cap_mb``."""
    import torch.distributed as dist

    if bucket_cap_mb is None:
        cap = int(DEFAULT_BUCKET_CAP_MB * MIB)
        return int(getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", MIB)), cap
    try:
        value = float(bucket_cap_mb)
    except (TypeError, ValueError):
        raise ConfigError(f"bucket_cap_mb must be a number, got {bucket_cap_mb!r}") from None
    if not value > 0:
        raise ConfigError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb}")
    cap = int(value * MIB)
    return cap, cap


def bucket_plan(workload_or_model: Workload | torch.nn.Module | str,
                bucket_cap_mb: float | None = None,
                dtype: str | torch.dtype | None = None,
                order: str = "reverse") -> BucketPlan:
    """DDP's bucket assignment for a workload (name or object) or any module.

    Args:
        workload_or_model: a :class:`Workload` (its default model is built on the meta
            device, in its ``param_dtype``), a registered name, or an ``nn.Module``.
        bucket_cap_mb: DDP's ``bucket_cap_mb``; None = 25 MiB with a 1 MiB first bucket.
        dtype: gradient dtype to plan for (e.g. ``"float32"`` for the paper's setting);
            None = the workload's ``param_dtype`` / the module's own dtypes.
        order: ``"reverse"`` (DDP's initial assumption) or ``"ready"`` (the traced
            gradient order DDP rebuilds its buckets from; workloads only).

    Example::

        bucket_plan("gpt2-xl", dtype="float32").num_buckets   # 145
        bucket_plan(my_model, bucket_cap_mb=50).bucket_bytes
    """
    import torch.distributed as dist

    if isinstance(workload_or_model, str):
        from ccddp.workloads.registry import get_workload

        workload_or_model = get_workload(workload_or_model)
    if isinstance(workload_or_model, Workload):
        label = workload_or_model.name
        model = workload_or_model.build_model(device="meta")
    elif isinstance(workload_or_model, torch.nn.Module):
        label = type(workload_or_model).__name__
        model = workload_or_model
    else:
        raise ConfigError(f"bucket_plan needs a workload name, Workload or nn.Module, "
                          f"got {type(workload_or_model).__name__}")
    if order not in ("reverse", "ready"):
        raise ConfigError(f"order must be 'reverse' or 'ready', got {order!r}")
    if order == "ready" and not isinstance(workload_or_model, Workload):
        raise ConfigError("order='ready' needs a workload (its batch drives the traced backward)")
    first, cap = bucket_limits(bucket_cap_mb)
    names, params, sparse = reducer_parameters(model)
    if not params:
        raise ConfigError(f"{label} has no trainable parameters")
    if dtype is not None:
        target = parse_dtype(dtype)
        # Shape-only stand-ins: the assignment reads numel, element size, dtype, device.
        tensors = [torch.empty(p.shape, dtype=target, device="meta") for p in params]
    else:
        tensors = [p.detach() for p in params]
    dtypes = {t.dtype for t in tensors}

    n = len(tensors)
    if order == "reverse":
        indices, _limits = dist._compute_bucket_assignment_by_size(
            list(reversed(tensors)), [first, cap], list(reversed(sparse)))
        buckets = [[n - 1 - i for i in bucket] for bucket in indices]
    else:
        ready = workload_or_model.gradient_ready_order()
        # As Reducer::rebuild_buckets: tensors in ready order with their indices, which
        # also tells the assignment to keep buckets in creation (= launch) order.
        buckets, _limits = dist._compute_bucket_assignment_by_size(
            [tensors[i] for i in ready], [first, cap], [sparse[i] for i in ready], ready)
    return BucketPlan(
        workload=label,
        num_params=sum(t.numel() for t in tensors),
        num_tensors=n,
        bucket_bytes=[sum(tensors[i].numel() * tensors[i].element_size() for i in b) for b in buckets],
        bucket_numel=[sum(tensors[i].numel() for i in b) for b in buckets],
        bucket_params=[[names[i] for i in b] for b in buckets],
        dtype=dtype_name(dtypes.pop()) if len(dtypes) == 1 else "mixed",
        bucket_cap_mb=None if bucket_cap_mb is None else float(bucket_cap_mb),
        first_bucket_bytes=first,
        bucket_bytes_cap=cap,
        order=order,
    )
