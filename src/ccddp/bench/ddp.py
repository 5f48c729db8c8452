"""``SecureDDP``: plain ``DistributedDataParallel`` on a ``ccddp`` group (``cc="on"``), or on
its plaintext group (``cc="off"``, the measuring baseline), with per-iteration timing marks.

The measuring harness of ``ccddp train``, not a way in: a user's script runs plain DDP on
the backend (``init_process_group("ccddp")``), which is what ``cc="on"`` measures.

With ``cc="on"`` everything DDP sends -- the parameter-shape check, the parameter and
buffer syncs, the rebuilt bucket layout, every gradient bucket -- goes through the
``ccddp`` backend, sealed, and the gradient all-reduces run on a group's op queue while
backward goes on. ``process_group=`` may be a ccddp group (used as is) or any group (a
ccddp group over the same ranks is created: a collective call, as ``new_group`` is).

Comm hooks compose: ``register_comm_hook`` takes any hook (PowerSGD, fp16/bf16
compression, your own) and wraps it with the timing mark; without one, DDP's default
all-reduce hook is registered at the first forward, on the model's one ccddp group. The
gradients and DDP's own syncs share that group, as in a user's DDP on the backend, and are
told apart by op in :meth:`counters`: the gradients are the group's all-reduces, DDP's
syncs every other op (its parameter, buffer and bucket-layout broadcasts, its
parameter-shape check).

Example::

    dist.init_process_group("gloo")
    model = SecureDDP(torch.nn.Linear(8, 8), cc="on", settings=CommSettings(impl="secure"))
    loss = model(torch.randn(4, 8)).sum()
    loss.backward()                        # gradients averaged with AES-GCM on every hop
"""

from __future__ import annotations

import inspect
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from ccddp.backend import BACKEND_NAME, Options
from ccddp.backend.process_group import ProcessGroupCCDDP
from ccddp.comm import CommSettings
from ccddp.crypto import GroupSecret
from ccddp.crypto.counters import CryptoCounters
from ccddp.bench.hooks import HookState, timed
from ccddp.errors import ConfigError

_DDP_TAKES_FORWARD_SYNC = "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters


def ccddp_group(process_group: dist.ProcessGroup | None, settings: CommSettings | None,
                secret: GroupSecret | None) -> ProcessGroupCCDDP:
    """``process_group`` if it is a ccddp group (and nothing asks for other settings),
    else a new ccddp group over its ranks (collective, like ``dist.new_group``)."""
    pg = process_group if process_group is not None else dist.group.WORLD
    if isinstance(pg, ProcessGroupCCDDP) and settings is None and secret is None:
        return pg
    settings = settings or CommSettings()
    return dist.new_group(dist.get_process_group_ranks(pg), backend=BACKEND_NAME,
                          timeout=timedelta(seconds=settings.timeout_s),
                          pg_options=Options(settings=settings, secret=secret))


class SecureDDP(DistributedDataParallel):
    def __init__(self, module: torch.nn.Module, *, cc: str = "on", settings: CommSettings | None = None,
                 secret: GroupSecret | None = None, bucket_cap_mb: float | None = None,
                 broadcast_buffers: bool = True, process_group: dist.ProcessGroup | None = None,
                 **ddp_kwargs) -> None:
        if cc not in ("on", "off"):
            raise ConfigError(f"cc must be 'on' or 'off', got {cc!r}")
        if not dist.is_initialized():
            raise ConfigError("torch.distributed is not initialized: call dist.init_process_group first")
        if cc == "off" and (settings is not None or secret is not None):
            raise ConfigError("cc='off' runs gloo's own collectives: it takes no ccddp settings or secret")
        if cc == "on" and settings is not None and not settings.secure:
            raise ConfigError(f"cc='on' needs a secure impl (secure or secure-naive), got {settings.impl!r}")
        if cc == "on":
            process_group = ccddp_group(process_group, settings, secret)
        elif isinstance(process_group or dist.group.WORLD, ProcessGroupCCDDP):
            raise ConfigError("cc='off' is the plaintext baseline: give it a gloo group, not a ccddp one")
        # `forward_sync_buffers` is torch 2.13's name for what `broadcast_buffers` meant
        # (older DDP knows only the latter); DDP syncs buffers at construction either way.
        sync = "forward_sync_buffers" if _DDP_TAKES_FORWARD_SYNC else "broadcast_buffers"
        super().__init__(module, process_group=process_group, bucket_cap_mb=bucket_cap_mb,
                         **{sync: broadcast_buffers}, **ddp_kwargs)
        pg = self.process_group
        self.cc = cc
        if isinstance(pg, ProcessGroupCCDDP):
            # The engine group under the model's ccddp group: its secret, session id, links.
            self.secure_group = pg.endpoint
            self.hook_state = HookState(pg, pg.endpoint, pg.queue)
        else:
            self.secure_group = None
            self.hook_state = HookState(pg)
        self._hooked = False

    def register_comm_hook(self, state: object, hook) -> None:
        """DDP's ``register_comm_hook``, with the timing mark added."""
        super().register_comm_hook(state, timed(hook, self.hook_state))
        self._hooked = True

    @torch.compiler.disable
    def _default_hook(self) -> None:
        if not self._hooked:
            self.register_comm_hook(self.hook_state.pg, default_hooks.allreduce_hook)

    def forward(self, *inputs, **kwargs):
        self._default_hook()
        return super().forward(*inputs, **kwargs)

    def comm_failure(self) -> BaseException | None:
        """The typed error (e.g. ``IntegrityError``) that stopped this model's ccddp group.

        DDP re-raises a failed collective as a ``RuntimeError`` from ``backward``; this gives
        back the original error::

            try:
                loss.backward()
            except RuntimeError:
                if model.comm_failure():
                    raise model.comm_failure() from None
                raise
        """
        queue = self.hook_state.worker   # the ccddp group's op queue; None with cc="off"
        return queue.failure if queue is not None else None

    def counters(self) -> dict:
        """Crypto counters of this rank, gradients and DDP's own syncs apart: the group's
        all-reduces (every bucket's, whatever hook issued it) and every other op of the
        group (parameter, buffer and layout broadcasts, the parameter-shape check); all
        zero with cc="off".

        Example::

            before = model.counters()
            loss.backward()
            sealed = model.counters()["gradients"]["bytes_sealed"] - before["gradients"]["bytes_sealed"]
        """
        if self.secure_group is None:
            empty = CryptoCounters().snapshot()
            return {"gradients": empty, "broadcasts": empty}
        pg = self.process_group
        grads = pg.crypto_counters("all_reduce")
        return {"gradients": grads, "broadcasts": CryptoCounters.diff(pg.crypto_counters(), grads)}

    def close(self) -> None:
        """Nothing to release: a ccddp group lives until ``destroy_process_group``."""
