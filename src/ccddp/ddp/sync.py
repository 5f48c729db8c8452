"""Secure replacement for DDP's plaintext parameter and buffer broadcasts.

DDP broadcasts parameters and buffers from rank 0 at construction and, by default,
buffers before every forward. In CC-on both go through ccddp's secure broadcast instead,
coalesced into one flat buffer per dtype so a model costs a few collectives, not one
per tensor.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ccddp.comm import SecureGroup, broadcast

_BATCH_BYTES = 128 << 20


def secure_broadcast_tensors(tensors: Iterable[torch.Tensor], group: SecureGroup, src: int = 0) -> int:
    """Overwrite ``tensors`` on every rank with rank ``src``'s values; returns collectives used.

    Example::

        secure_broadcast_tensors(list(model.parameters()), group)
    """
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    batches = []
    for dtype in sorted(by_dtype, key=str):
        # Batches of at most _BATCH_BYTES: a GPT-2 flattened whole would need another
        # full copy of the model (plus its frames) on every rank.
        batch, size = [], 0
        for t in by_dtype[dtype]:
            if batch and size + t.numel() * t.element_size() > _BATCH_BYTES:
                batches.append(batch)
                batch, size = [], 0
            batch.append(t)
            size += t.numel() * t.element_size()
        batches.append(batch)
    calls = 0
    for ts in batches:
        with torch.no_grad():
            flat = _flatten_dense_tensors([t.detach() for t in ts])
            broadcast(flat, src, group)
            for t, synced in zip(ts, _unflatten_dense_tensors(flat, ts)):
                t.copy_(synced)
        calls += 1
    return calls


def module_states(module: torch.nn.Module, *, params: bool = True, buffers: bool = True) -> list[torch.Tensor]:
    """What DDP would broadcast: parameters and/or buffers, in a deterministic order."""
    out = []
    if params:
        out += [p.data for p in module.parameters()]
    if buffers:
        out += [b for b in module.buffers()]
    return out
