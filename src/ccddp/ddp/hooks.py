"""DDP communication hooks, in the style of ``torch.distributed.algorithms.ddp_comm_hooks``.

``secure_allreduce_hook`` hands each gradient bucket to a :class:`CommWorker` that runs
ccddp's secure all-reduce; ``plain_allreduce_hook`` is DDP's default (gloo all-reduce of
``bucket / world_size``). Both record when the last bucket of an iteration was handed
over, so a step can split backward compute from exposed communication.
"""

# No "from __future__ import annotations": DDP checks the hook annotations at runtime.

import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ccddp.comm import SecureGroup, all_reduce
from ccddp.ddp.worker import CommWorker


class HookState:
    """State of the hooks: the group, its worker, and per-iteration timing marks.

    Example::

        state = HookState(SecureGroup(CommSettings(), pg=dist.new_group(backend="gloo")))
        ddp_model.register_comm_hook(state, secure_allreduce_hook)
    """

    def __init__(self, group: "SecureGroup | None" = None, pg: "dist.ProcessGroup | None" = None) -> None:
        self.group = group
        self.pg = group.pg if group is not None else pg
        self.world_size = dist.get_world_size(self.pg)
        self.worker = CommWorker(self._reduce) if group is not None else None
        self.last_bucket_ready = 0.0
        self.buckets = 0

    def _reduce(self, tensor: torch.Tensor) -> None:
        tensor.div_(self.world_size)
        all_reduce(tensor, self.group)

    def mark(self) -> None:
        self.last_bucket_ready = time.perf_counter()
        self.buckets += 1

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()


def secure_allreduce_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket over the group with AES-GCM on every hop, off the backward thread.

    Example::

        state = HookState(SecureGroup(CommSettings(impl="secure"), pg=dist.new_group(backend="gloo")))
        ddp_model.register_comm_hook(state, secure_allreduce_hook)
    """
    state.mark()
    return state.worker.submit(bucket.buffer())


def plain_allreduce_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's own all-reduce (CC-off), timed like the secure hook.

    Example::

        ddp_model.register_comm_hook(HookState(pg=dist.group.WORLD), plain_allreduce_hook)
    """
    state.mark()
    return default_hooks.allreduce_hook(state.pg, bucket)
