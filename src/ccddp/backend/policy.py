"""Under a ``ccddp`` default group, every later group is sealed too.

A script that runs ``init_process_group("ccddp")`` has said that its model data must not
leave a rank in plaintext; a library that then makes a group of its own with
``new_group(backend="gloo")`` (distributed checkpointing, FSDP and device-mesh utilities
do) would otherwise get a plaintext gloo group without a word. So once a ccddp group
exists, :func:`install` puts one check on the function every c10d group is built by
(``new_group``, ``new_subgroups``, device meshes): while the default group is ccddp,

- ``"gloo"`` and ``"nccl"`` (in any device form, or no backend) are served by ccddp,
  which seals CPU and CUDA tensors, with the group's timeout; options meant for them are
  dropped (ccddp has its own, from ``CCDDP_SETTINGS``);
- a backend ccddp cannot stand in for (MPI, UCC, a third-party plug-in) is refused with a
  :class:`ConfigError` naming it, instead of running in plaintext.

A process whose default group is not ccddp is left as it is. ``ccddp launch`` rewrites the
script's own ``init_process_group`` with :func:`secure_backend` as well.

The policy fails closed where it does not look: a gloo or NCCL backend built any other way
while the default group is ccddp (``ProcessGroupGloo(...)`` called directly, then handed to
DDP or a collective; ``torch.distributed._dist2.new_group("gloo")``; a torch release that
builds groups without the helper) is refused at its constructor with a
:class:`ConfigError`, whatever name it was reached by. Only ccddp's own modules build
those (its links carry sealed frames, or a proven domain's loopback traffic). And the
private names the policy hooks are checked (:mod:`ccddp.backend.torch_private`) before
any ccddp group exists: on a torch that moved them, no group is made.

Example::

    dist.init_process_group("ccddp")
    pg = dist.new_group([0, 1], backend="gloo")     # a ccddp group: sealed
    dist.get_backend(pg)                            # "ccddp"
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ccddp.backend import torch_private
from ccddp.backend.registration import BACKEND_NAME, Options
from ccddp.errors import ConfigError


# The backends ccddp stands in for: its ops cover theirs, for CPU and CUDA tensors.
_SERVED = ("gloo", "nccl")


def secure_backend(backend: str | None) -> str:
    """The backend string to use instead of ``backend``: gloo, NCCL (or none) become
    ccddp, ccddp stays; anything else raises :class:`ConfigError`.

    Example::

        secure_backend("cpu:gloo,cuda:nccl")     # "cpu:ccddp,cuda:ccddp"
    """
    if backend is None or str(backend).lower() == "undefined":
        return BACKEND_NAME
    parts = []
    for part in str(backend).lower().split(","):
        device, _, name = part.rpartition(":")
        if name in _SERVED:
            name = BACKEND_NAME
        if name != BACKEND_NAME:
            raise ConfigError(f"ccddp cannot seal the {name} backend, and this process's groups must be sealed "
                              "(ccddp serves CPU and CUDA process groups, in place of gloo and NCCL)")
        parts.append(f"{device}:{name}" if device else name)
    return ",".join(parts)


def default_is_ccddp() -> bool:
    """Whether this process's default group is served by ccddp."""
    return dist.is_initialized() and BACKEND_NAME in str(dist.get_backend())


def _sealing(helper):
    signature = inspect.signature(helper)

    @functools.wraps(helper)
    def build_group(*args, **kwargs):
        if not default_is_ccddp():
            return helper(*args, **kwargs)
        call = signature.bind(*args, **kwargs)
        asked = call.arguments["backend"]
        call.arguments["backend"] = secure_backend(asked)
        if not isinstance(call.arguments.get("backend_options"), (Options, type(None))):
            call.arguments["backend_options"] = None  # e.g. gloo's options for a group ccddp now serves
        return helper(*call.args, **call.kwargs)

    build_group.__ccddp_sealing__ = True
    return build_group


_BARE = threading.local()


@contextlib.contextmanager
def bare_links():
    """Inside this block the calling thread may build gloo/NCCL backends under a ccddp
    default group: for a transport that carries only ccddp's sealed frames (a test's
    emulated wire, an adversary's link), as ccddp's own modules do.

    Example::

        with bare_links():
            up = dist.ProcessGroupGloo(dist.PrefixStore("wire-up/", store), rank, n, timeout)
    """
    _BARE.depth = getattr(_BARE, "depth", 0) + 1
    try:
        yield
    finally:
        _BARE.depth -= 1


def _plaintext_refusal(kind: str):
    def refuse(caller: str) -> str | None:
        # ccddp's own modules build bare gloo/NCCL sets for sealed frames (backend.links,
        # comm.ordered) and the plaintext references of its measuring tools.
        if caller == "ccddp" or caller.startswith("ccddp.") or getattr(_BARE, "depth", 0) or not default_is_ccddp():
            return None
        return (f"a {kind} process group built by {caller or 'unknown code'} would carry this process's data in "
                f"plaintext, and the default group is ccddp: use dist.new_group(backend=\"gloo\") (sealed by "
                "ccddp) or a ccddp group instead")

    return refuse


def _monitoring(fn):
    @functools.wraps(fn)
    def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
        pg = group if group is not None else (c10d._get_default_group() if dist.is_initialized() else None)
        if pg is None or BACKEND_NAME not in str(dist.get_backend(pg)) or c10d._rank_not_in_group(pg):
            return fn(group, timeout, wait_all_ranks)  # torch's own checks and messages
        if isinstance(timeout, (int, float)):
            timeout = timedelta(seconds=timeout)
        return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    monitored_barrier.__ccddp_monitoring__ = True
    return monitored_barrier


def install_monitored_barrier() -> None:
    """``dist.monitored_barrier`` on a ccddp group: torch refuses every backend not named
    gloo before it asks the group; ccddp's groups run gloo's protocol sealed
    (``ProcessGroupCCDDP.monitored_barrier``), so the check lets them through (idempotent)."""
    fn = c10d.monitored_barrier
    if not getattr(fn, "__ccddp_monitoring__", False):
        c10d.monitored_barrier = dist.monitored_barrier = _monitoring(fn)


def install() -> None:
    """Apply the policy to every group created from now on (idempotent)."""
    torch_private.require()
    install_monitored_barrier()
    helper = c10d._new_process_group_helper
    if not getattr(helper, "__ccddp_sealing__", False):
        c10d._new_process_group_helper = _sealing(helper)
    torch_private.guard_constructor(dist.ProcessGroupGloo, _plaintext_refusal("gloo"))
    if dist.is_nccl_available():
        torch_private.guard_constructor(dist.ProcessGroupNCCL, _plaintext_refusal("NCCL"))
