"""Kernel launches of one DDP training iteration, counted from the model definition.

Under confidential computing every kernel launch crosses the CPU-GPU boundary through
the bounce path and costs several times its CC-off time (Hopper ~2-2.6x, Blackwell
~3.5-3.9x, measured in production), so an eager training step pays that toll once per
launch. This module counts the launches of one step without a GPU:

* forward + loss and backward: every ATen operator dispatched while one step of a
  one-sample batch runs (:class:`torch.utils._python_dispatch.TorchDispatchMode`) on the
  meta device, or on the CPU where the model reads tensor values. Attention and dropout
  run through the fused kernels CUDA would pick (meta and CPU tensors decompose them into
  a dozen operators each). Views, aliases and allocations launch no kernel and are not
  counted; every other operator is counted as one launch. The count does not depend on
  the batch size (the same operators run on larger tensors);
* the optimizer: the operators a steady-state ``torch.optim.Adam(foreach=True)`` step
  dispatches (PyTorch's default on a GPU), each multi-tensor operator counted as the
  launches CUDA's multi-tensor apply splits it into (tensors and elements per launch);
* DDP: with ``gradient_as_bucket_view=False`` (the default) the Reducer copies each
  gradient into its bucket and back (two per parameter tensor), divides each bucket by
  the world size and launches one collective per bucket (two per bucket).

It is an estimate, and says so: a cuBLAS matmul may launch more than one kernel, a
multi-tensor operator launches one kernel per batch of tensors, and fused kernels
(``torch.compile``, CUDA graphs) launch fewer; none of that is visible without the GPU.

Example::

    from ccddp.workloads import get_workload
    count_launches(get_workload("bert-base")).total      # ~2,000
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ccddp.workloads.base import Workload

_aten = torch.ops.aten
# Operators that allocate or re-describe memory, or read a host scalar, without a kernel.
_NO_KERNEL = {_aten.empty, _aten.empty_strided, _aten.empty_like, _aten.new_empty,
              _aten.new_empty_strided, _aten.detach, _aten.alias, _aten.lift_fresh,
              _aten._unsafe_view, _aten.set_, _aten.resize_, _aten.as_strided,
              _aten._local_scalar_dense}
# CUDA's multi-tensor apply (torch/csrc: MultiTensorApply.cuh): one launch covers at most
# this many tensors (by the number of tensor lists the operator takes) and 320 chunks of
# 65536 elements.
_MTA_TENSORS = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}
_MTA_CHUNK, _MTA_BLOCKS = 65536, 320


def _multi_tensor_launches(args) -> int:
    lists = [a for a in args if isinstance(a, (list, tuple)) and a
             and isinstance(a[0], torch.Tensor)]
    if not lists:
        return 1
    tensors = lists[0]
    per_launch = _MTA_TENSORS.get(len(lists), 30)
    chunks = sum(-(-t.numel() // _MTA_CHUNK) for t in tensors)
    return max(-(-len(tensors) // per_launch), -(-chunks // _MTA_BLOCKS), 1)


@dataclass(frozen=True)
class LaunchCount:
    """Kernel launches of one iteration, by phase (see the module docstring)."""

    forward: int
    backward: int
    optimizer: int
    ddp: int
    device: str

    @property
    def total(self) -> int:
        return self.forward + self.backward + self.optimizer + self.ddp

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if func.namespace == "aten" and not func.is_view and \
                func.overloadpacket not in _NO_KERNEL:
            self.ops[name] += _multi_tensor_launches(args) if name.startswith(
                "aten._foreach_") else 1
        return func(*args, **(kwargs or {}))


class _AsOnCuda(TorchFunctionMode):
    """Run attention and dropout through the fused kernels CUDA's dispatcher picks, which
    meta and CPU tensors would otherwise decompose into a dozen operators (the
    memory-efficient attention kernel and ``native_dropout``, forward and backward)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return _fused_attention(*args, **kwargs)
        if func is F.dropout:
            return _fused_dropout(*args, **kwargs)
        return func(*args, **kwargs)


def _fused_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                     enable_gqa=False):
    out = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, attn_mask, True, dropout_p, is_causal, scale=scale)
    return out[0]


def _fused_dropout(x, p=0.5, training=True, inplace=False):
    if not training or p == 0:
        return x
    return torch.ops.aten.native_dropout(x, p, True)[0]


def _step_inputs(wl: Workload, device: str, model: torch.nn.Module | None = None
                 ) -> tuple[Workload, torch.nn.Module, dict]:
    small = {"batch_size": 1}
    if "num_nodes" in wl.settings:
        # A graph's size changes no operator that runs; a small one builds in milliseconds.
        small["num_nodes"] = 1000
    probe = type(wl)(wl.name, wl.size, **{**wl.settings, **small})
    if model is None or next(model.parameters()).device.type != device:
        model = probe.build_model(device=device)
    batch = probe.make_batch(0, 0, 1)
    if device == "meta":
        # transformers reads mask values (impossible on meta); a mask changes no operator
        # that runs, only which positions it ignores.
        batch.pop("attention_mask", None)
    return probe, model, {k: v.to(device) for k, v in batch.items()}


def _count_step(wl: Workload, device: str, model: torch.nn.Module | None = None
                ) -> tuple[int, int, list[torch.Tensor]]:
    probe, model, batch = _step_inputs(wl, device, model)
    fwd, bwd = _Counter(), _Counter()
    with torch.device(device):
        with _AsOnCuda(), fwd:
            loss = probe.loss(model, batch)
        with bwd:
            loss.backward()
    params = [p for p in model.parameters() if p.requires_grad]
    return sum(fwd.ops.values()), sum(bwd.ops.values()), params


def count_launches(wl: Workload, buckets: int | None = None,
                   model: torch.nn.Module | None = None) -> LaunchCount:
    """Count one iteration's kernel launches of ``wl`` (meta device where the model runs
    there, else CPU with a one-sample batch); ``buckets``: DDP's buckets per iteration
    (default: from :func:`ccddp.workloads.bucket_plan`); ``model``: ``wl``'s model already
    built on the meta device (its gradients are written)."""
    try:
        fwd, bwd, params = _count_step(wl, "meta", model)
        device = "meta"
    except (RuntimeError, NotImplementedError, ValueError, TypeError):
        # A model that reads tensor values (a graph's size from its edge index) cannot
        # run on meta; one sample on the CPU dispatches the same operators.
        fwd, bwd, params = _count_step(wl, "cpu")
        device = "cpu"
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    opt = torch.optim.Adam(params, lr=1e-3, foreach=True)
    opt.step()                      # the first step creates the state; count the second
    counter = _Counter()
    with counter:
        opt.step()
    if buckets is None:
        from ccddp.workloads.bucketing import bucket_plan

        buckets = bucket_plan(wl).num_buckets
    return LaunchCount(forward=fwd, backward=bwd, optimizer=sum(counter.ops.values()),
                       ddp=2 * len(params) + 2 * buckets, device=device)


__all__ = ["LaunchCount", "count_launches"]
