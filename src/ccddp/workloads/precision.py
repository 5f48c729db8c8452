"""Reduced-precision parameters with float32 matrix multiplies.

When memory forces bfloat16 parameters (GPT2-XL: two ranks of fp32 parameters and
gradients do not fit in 24 GB), the GEMMs should still run in float32 on CPUs without
native bfloat16 (no AVX512-BF16/AMX): measured on this project's machines (AVX2),
``F.linear`` runs at ~4.5 GFLOP/s in bfloat16 against ~50 GFLOP/s in float32, which
makes one GPT2-XL step take 90 s instead of under 10.

:func:`upcast_matmuls` swaps the forward of every ``nn.Linear`` and ``transformers``
``Conv1D`` for a ``torch.autograd.Function`` that upcasts the weight just for the
product, in forward and again in backward. Parameters, gradients (what DDP buckets and
all-reduces) and the activations between layers keep the parameter dtype; only one
layer's weight exists in float32 at a time, and nothing in float32 is saved for
backward (a plain ``weight.float()`` would keep a float32 copy of the whole model alive
until backward). Written by hand because ``torch.autocast`` only lowers precision; it has
no "store low, compute high" mode.

Example::

    model = GPT2LMHeadModel(config).to(torch.bfloat16)
    upcast_matmuls(model)              # returns the number of layers changed
"""

from __future__ import annotations

import threading
import types

import torch

_local = threading.local()


def _scratch(slot: int, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A reusable buffer shaped like ``like``.

    Fresh multi-megabyte allocations are served by mmap and page-faulted on first touch,
    which made the upcast copies 8x slower than the copy itself (0.2 vs 1.5 Gelem/s);
    reusing one buffer per slot and thread avoids that. Only one layer runs at a time,
    so a buffer is never used by two products at once.
    """
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = {}
    key = (slot, dtype, like.device)
    buf = buffers.get(key)
    if buf is None or buf.numel() < like.numel():
        buf = buffers[key] = torch.empty(like.numel(), dtype=dtype, device=like.device)
    return buf[: like.numel()].view(like.shape)


class _UpcastLinear(torch.autograd.Function):
    """``y = x @ W^T + b`` (``transposed=False``) or ``x @ W + b`` (Conv1D layout)."""

    @staticmethod
    def forward(ctx, x, weight, bias, transposed, compute_dtype):  # noqa: D102
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        ctx.transposed = transposed
        ctx.compute_dtype = compute_dtype
        w = _scratch(0, weight, compute_dtype).copy_(weight)
        x2 = x.reshape(-1, x.shape[-1]).to(compute_dtype)
        y = x2 @ (w if transposed else w.t())
        if bias is not None:
            y += bias.to(compute_dtype)
        return y.to(x.dtype).reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102
        x, weight = ctx.saved_tensors
        cd = ctx.compute_dtype
        g = grad_out.reshape(-1, grad_out.shape[-1]).to(cd)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            w = _scratch(0, weight, cd).copy_(weight)
            grad_x = (g @ (w.t() if ctx.transposed else w)).to(x.dtype).reshape(x.shape)
        if ctx.needs_input_grad[1]:
            x2 = x.reshape(-1, x.shape[-1]).to(cd)
            full = _scratch(1, weight, cd)
            torch.mm(x2.t(), g, out=full) if ctx.transposed else torch.mm(g.t(), x2, out=full)
            grad_w = full.to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g.sum(0).to(weight.dtype)
        return grad_x, grad_w, grad_b, None, None


def _linear_forward(self, x):
    return _UpcastLinear.apply(x, self.weight, self.bias, False, self._ccddp_compute_dtype)


def _conv1d_forward(self, x):
    return _UpcastLinear.apply(x, self.weight, self.bias, True, self._ccddp_compute_dtype)


def upcast_matmuls(model: torch.nn.Module, compute_dtype: torch.dtype = torch.float32) -> int:
    """Run the matmuls of ``model``'s linear layers in ``compute_dtype``; returns how
    many layers were changed (layers already in ``compute_dtype`` are left alone)."""
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # transformers absent: only nn.Linear to handle
        Conv1D = ()
    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            forward = _linear_forward
        elif Conv1D and isinstance(module, Conv1D):
            forward = _conv1d_forward
        else:
            continue
        if module.weight.dtype == compute_dtype:
            continue
        module._ccddp_compute_dtype = compute_dtype
        module.forward = types.MethodType(forward, module)
        changed += 1
    return changed
