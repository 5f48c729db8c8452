"""``SecureDDP``: DistributedDataParallel whose gradients, parameters, buffers and DDP's
own metadata never cross a link in plaintext (``cc="on"``), or plain DDP with the same
timing marks (``cc="off"``).

CC-on changes two things in DDP:
1. its process group is a :class:`SecureProcessGroup`, so every collective DDP runs by
   itself -- the parameter-shape check and parameter/buffer sync at construction, the
   buffer sync before every forward, the rebuilt bucket layout after iteration 0 -- is a
   sealed ccddp collective;
2. every backward: a comm hook that all-reduces each bucket securely on a worker thread.
The hook and DDP's own collectives run on separate secure groups (separate process
groups), so the worker's point-to-point traffic never interleaves with the main thread's.

Example::

    dist.init_process_group("gloo")
    model = SecureDDP(torch.nn.Linear(8, 8), cc="on", settings=CommSettings(impl="secure"))
    loss = model(torch.randn(4, 8)).sum()
    loss.backward()                        # gradients averaged with AES-GCM on every hop
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ccddp.comm import CommSettings, SecureGroup
from ccddp.crypto import GroupSecret
from ccddp.crypto.counters import CryptoCounters
from ccddp.ddp.hooks import HookState, plain_allreduce_hook, secure_allreduce_hook
from ccddp.ddp.process_group import SecureProcessGroup
from ccddp.errors import ConfigError


class SecureDDP(DistributedDataParallel):
    def __init__(self, module: torch.nn.Module, *, cc: str = "on", settings: CommSettings | None = None,
                 secret: GroupSecret | None = None, bucket_cap_mb: float | None = None,
                 broadcast_buffers: bool = True, **ddp_kwargs) -> None:
        if cc not in ("on", "off"):
            raise ConfigError(f"cc must be 'on' or 'off', got {cc!r}")
        if not dist.is_initialized():
            raise ConfigError("torch.distributed is not initialized: call dist.init_process_group first")
        settings = settings or CommSettings()
        if cc == "on" and not settings.secure:
            raise ConfigError(f"cc='on' needs a secure impl (secure or secure-naive), got {settings.impl!r}")
        timeout = timedelta(seconds=settings.timeout_s)
        # `forward_sync_buffers` is DDP's name for what `broadcast_buffers` meant; DDP
        # syncs buffers at construction either way.
        if cc == "on":
            # new_group is collective: every rank creates both groups in this order.
            hook_pg = dist.new_group(backend="gloo", timeout=timeout)
            sync_pg = dist.new_group(backend="gloo", timeout=timeout)
            sync_group = SecureGroup(settings, secret, sync_pg)
            super().__init__(module, process_group=SecureProcessGroup(sync_group),
                             forward_sync_buffers=broadcast_buffers, bucket_cap_mb=bucket_cap_mb, **ddp_kwargs)
            self.sync_group: SecureGroup | None = sync_group
            self.hook_state = HookState(SecureGroup(settings, secret, hook_pg))
            self.register_comm_hook(self.hook_state, secure_allreduce_hook)
        else:
            super().__init__(module, forward_sync_buffers=broadcast_buffers, bucket_cap_mb=bucket_cap_mb,
                             **ddp_kwargs)
            self.hook_state = HookState(pg=self.process_group)
            self.sync_group = None
            self.register_comm_hook(self.hook_state, plain_allreduce_hook)
        self.cc = cc
        self.ccddp_settings = settings

    def comm_failure(self) -> BaseException | None:
        """The typed error (e.g. ``IntegrityError``) that failed a bucket, if any.

        DDP re-raises a failed comm-hook future as a ``RuntimeError`` from ``backward``;
        this gives back the original error::

            try:
                loss.backward()
            except RuntimeError:
                if model.comm_failure():
                    raise model.comm_failure() from None
                raise
        """
        worker = self.hook_state.worker
        return worker.failure if worker is not None else None

    def counters(self) -> dict:
        """Crypto counters of this rank: gradient all-reduces and broadcasts, separately."""
        empty = CryptoCounters().snapshot()
        grads = self.hook_state.group.counters.snapshot() if self.hook_state.group else empty
        sync = self.sync_group.counters.snapshot() if self.sync_group else empty
        return {"gradients": grads, "broadcasts": sync}

    def close(self) -> None:
        self.hook_state.close()
        for g in (self.hook_state.group, self.sync_group):
            if g is not None:
                g.close()
