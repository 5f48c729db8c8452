"""Timing marks for DDP comm hooks, in the style of
``torch.distributed.algorithms.ddp_comm_hooks``.

``timed(hook, state)`` wraps any comm hook (DDP's default all-reduce, PowerSGD, fp16/bf16
compression, a user's own) so each call records when its bucket was handed over; a step
can then split backward compute from exposed communication. The hook's collectives run on
whatever group it is given -- on a ``ccddp`` group they are sealed.
"""

# No "from __future__ import annotations": DDP checks the hook annotations at runtime.

import time

import torch
import torch.distributed as dist


class HookState:
    """Per-iteration timing marks of one DDP model, and the ccddp group it runs on.

    ``group`` is the group's :class:`~ccddp.comm.Endpoint` (None on a plaintext group)
    and ``worker`` its op queue (``.failure``: the error that stopped it).

    Example::

        state = HookState(pg)
        ddp_model.register_comm_hook(pg, timed(default_hooks.allreduce_hook, state))
    """

    def __init__(self, pg: "dist.ProcessGroup", group=None, worker=None) -> None:
        self.pg = pg
        self.group = group
        self.worker = worker
        self.world_size = pg.size()
        self.last_bucket_ready = 0.0
        self.buckets = 0

    def mark(self) -> None:
        self.last_bucket_ready = time.perf_counter()
        self.buckets += 1

    def close(self) -> None:
        """Nothing to release: the op queue belongs to the process group."""


def timed(hook, marks: HookState):
    """``hook`` with a timing mark before each bucket: a comm hook DDP accepts.

    Example::

        ddp_model.register_comm_hook(powersgd_state, timed(powerSGD.powerSGD_hook, marks))
    """

    def timed_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        marks.mark()
        return hook(state, bucket)

    timed_hook.__qualname__ = f"timed({getattr(hook, '__qualname__', 'hook')})"
    return timed_hook
