"""``ccddp`` as a torch.distributed backend: every collective of every tool, sealed.

Select it like gloo: ``dist.init_process_group("ccddp")`` (or ``"cpu:ccddp"``), or
``dist.new_group(ranks, backend="ccddp")``. Its groups are ordinary registered
torch.distributed groups, so DDP, Join, ZeroRedundancyOptimizer, FSDP, torch.compile,
DistributedSampler and the object collectives use them unchanged; every byte they send
is AES-256-GCM sealed by ccddp. An operation or dtype ccddp cannot run sealed raises an
error that names it -- there is no plaintext fallback.

Example::

    import ccddp.backend  # registers "ccddp" (installed: torch registers it by itself)
    dist.init_process_group("ccddp")
    model = DistributedDataParallel(model)   # plain DDP; gradients sealed on every hop
"""

from ccddp.backend.registration import BACKEND_NAME, Options, register

register()

__all__ = ["BACKEND_NAME", "Options", "register"]
