"""A ``torch.distributed.ProcessGroup`` whose collectives are ccddp's sealed ones.

DDP runs collectives of its own, from C++, on the process group it is given: the
parameter-shape check and parameter sync at construction, the buffer sync before every
forward, and rank 0's rebuilt bucket layout after iteration 0
(``Reducer::sync_bucket_indices``). Handed this group as ``process_group``, DDP sends
every one of them through :mod:`ccddp.comm` -- sealed, authenticated, replay-protected --
instead of plaintext gloo. Gradients still go through the comm hook on its own group.

Only what DDP uses is supported: ``broadcast``, ``allgather`` (equal sizes) and
``allreduce`` with SUM, on CPU tensors; any other collective raises.

This is written by hand because torch.distributed has no encrypted backend; it relies on
torch's Python ``ProcessGroup`` subclassing (the trampoline PyTorch tests DDP with).

Example::

    group = SecureGroup(CommSettings(), GroupSecret.from_env(), dist.new_group(backend="gloo"))
    ddp = DistributedDataParallel(model, process_group=SecureProcessGroup(group))
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from ccddp.comm import SecureGroup, all_gather, all_reduce, broadcast
from ccddp.errors import ConfigError

BACKEND_NAME = "ccddp-secure"


def _completed(result) -> dist.Work:
    fut = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


class SecureProcessGroup(dist.ProcessGroup):
    """Runs DDP's own collectives over ``group``'s sealed links, synchronously, on the
    calling thread. Counts each call by name in :attr:`calls`."""

    def __init__(self, group: SecureGroup) -> None:
        super().__init__(group.rank, group.world_size)
        if not group.settings.secure:
            raise ConfigError(f"SecureProcessGroup needs a secure impl, got {group.settings.impl!r}")
        self.group = group
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def broadcast(self, tensor_list, opts):
        self._count("broadcast")
        for t in tensor_list:
            broadcast(t, opts.rootRank, self.group)
        return _completed(tensor_list)

    def allgather(self, output_tensors, input_tensors, opts):
        self._count("allgather")
        for outs, x in zip(output_tensors, input_tensors):
            flat = x.contiguous().view(-1)
            if len(outs) != self.group.world_size or any(o.numel() != flat.numel() for o in outs):
                raise ConfigError("SecureProcessGroup.allgather needs one output per rank, each the input's size")
            gathered = torch.empty(len(outs) * flat.numel(), dtype=flat.dtype)
            all_gather(gathered, flat, self.group)
            for o, part in zip(outs, gathered.split(flat.numel())):
                o.copy_(part.view_as(o))
        return _completed(output_tensors)

    def allreduce(self, tensors, opts):
        self._count("allreduce")
        if opts.reduceOp != dist.ReduceOp.SUM:
            raise ConfigError("SecureProcessGroup.allreduce supports SUM only")
        for t in tensors:
            flat = t.contiguous()  # t itself when it already is
            all_reduce(flat, self.group)
            if flat is not t:
                t.copy_(flat)
        return _completed(tensors)

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def getRank(self) -> int:
        return self.group.rank

    def getSize(self) -> int:
        return self.group.world_size
