"""A host that rewrites what one rank receives through torch.distributed.

The threat model gives the host every byte torch.distributed carries. These tests play
it below ccddp, at torch.distributed's own functions, so the same attack runs against
any version of ccddp's code: :class:`HostileHost` wraps the calls through which a rank
receives bytes (broadcast, the all-gathers, irecv) and hands each received tensor to a
``rewrite`` callback before ccddp sees it. ccddp's links use process groups' own methods
(registered groups and the ccddp backend's bare gloo backends alike): their ``recv`` and
``allgather`` are wrapped too.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

Rewrite = Callable[[str, "list[torch.Tensor]"], None]


class _Done:
    """A completed work: the wrapped call ran synchronously."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class _RewrittenRecv:
    """A receive (or all-gather) whose buffers are rewritten when it is waited for."""

    def __init__(self, work, tensor: torch.Tensor, host: "HostileHost", kind: str = "irecv",
                 tensors: "list[torch.Tensor] | None" = None) -> None:
        self._work, self._host, self._kind = work, host, kind
        self._tensors = tensors if tensors is not None else [tensor]

    def wait(self, *args) -> bool:
        done = self._work.wait(*args)
        self._host.rewrite(self._kind, self._tensors)
        return done

    def is_completed(self) -> bool:
        return self._work.is_completed()


class HostileHost:
    """Install with :meth:`install`; while :attr:`active`, every tensor this rank receives
    goes through ``rewrite(kind, tensors)`` (kind: broadcast, all_gather, all_gather_flat,
    irecv), which may change it in place."""

    def __init__(self, rewrite: Rewrite) -> None:
        self.rewrite = rewrite
        self.active = False
        self._saved: list[tuple[object, str, object]] = []

    def install(self) -> "HostileHost":
        def wrap_collective(kind: str, orig, outputs: Callable[..., "list[torch.Tensor]"]):
            def call(*args, **kwargs):
                if not self.active:
                    return orig(*args, **kwargs)
                async_op = kwargs.pop("async_op", False)
                orig(*args, **kwargs)
                self.rewrite(kind, outputs(*args))
                return _Done() if async_op else None
            return call

        def wrap_irecv(orig):
            def call(tensor, *args, **kwargs):
                work = orig(tensor, *args, **kwargs)
                return _RewrittenRecv(work, tensor, self) if self.active else work
            return call

        wrappers = {
            "broadcast": lambda o: wrap_collective("broadcast", o, lambda t, *a: [t]),
            "all_gather": lambda o: wrap_collective("all_gather", o, lambda ts, *a: list(ts)),
            "all_gather_into_tensor": lambda o: wrap_collective("all_gather_flat", o, lambda out, *a: [out]),
            "all_gather_single": lambda o: wrap_collective("all_gather_flat", o, lambda out, *a: [out]),
            "irecv": wrap_irecv,
        }
        for name, make in wrappers.items():
            for module in (dist, c10d):
                orig = getattr(module, name, None)
                if orig is not None:
                    self._saved.append((module, name, orig))
                    setattr(module, name, make(orig))

        def wrap_backend_recv(orig):
            def call(backend, tensors, *args, **kwargs):
                work = orig(backend, tensors, *args, **kwargs)
                return _RewrittenRecv(work, tensors[0], self) if self.active else work
            return call

        def wrap_backend_allgather(orig):
            def call(backend, outputs, inputs, *args, **kwargs):
                work = orig(backend, outputs, inputs, *args, **kwargs)
                if not self.active:
                    return work
                return _RewrittenRecv(work, inputs[0], self, "all_gather", list(outputs[0]))
            return call

        for cls in (dist.ProcessGroupGloo, dist.ProcessGroup):
            for name, make in (("recv", wrap_backend_recv), ("allgather", wrap_backend_allgather)):
                orig = cls.__dict__.get(name)
                if orig is not None:
                    self._saved.append((cls, name, orig))
                    setattr(cls, name, make(orig))
        return self

    def uninstall(self) -> None:
        for module, name, orig in reversed(self._saved):
            setattr(module, name, orig)
        self._saved.clear()
