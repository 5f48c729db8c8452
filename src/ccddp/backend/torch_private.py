"""Every private PyTorch name ccddp depends on, and the check that they are all there.

ccddp is a torch.distributed backend written in Python; a few things it must do have no
public API (make a gloo group of its own, answer ``pg._get_backend(device)``, see every
group c10d creates so that none is left in plaintext under a ccddp default group). Each
such name is listed once, in :data:`NEEDS`, with the parameters or attributes ccddp uses.
:func:`check` verifies them against the running torch; the ccddp creator calls
:func:`require` before it builds a group, so a torch release that renamed, removed or
re-routed one of them makes ccddp refuse to create a group (a :class:`ConfigError`
naming the torch version and the name) instead of running with a hook that no longer
catches anything. ``tests/test_torch_compat.py`` asserts every entry on the torch it
runs on.

The same goes for the torch release itself: :func:`require` refuses a torch outside
:data:`TORCH_MIN` .. :data:`TORCH_BELOW` (the releases the README's compatibility table
measured) with one line.

Example::

    from ccddp.backend import torch_private
    [n.name for n in torch_private.check()]   # [] on a supported torch: nothing missing
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ccddp.errors import ConfigError

# The torch releases ccddp was measured on (README, "Torch releases"): TORCH_MIN <= version < TORCH_BELOW.
# pyproject.toml states the same range.
TORCH_MIN = (2, 11)
TORCH_BELOW = (2, 16)

_C10D = torch._C._distributed_c10d


def torch_release(version: str | None = None) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string (``"2.13.0+cpu"`` -> ``(2, 13)``)."""
    text = torch.__version__ if version is None else version
    m = re.match(r"(\d+)\.(\d+)", text)
    if m is None:
        raise ConfigError(f"cannot read torch's version {text!r}")
    return int(m.group(1)), int(m.group(2))


def _params(fn) -> list[str]:
    """Parameter names of a Python function (unwrapped) or a pybind11 method (its doc's
    first line, which pybind11 writes as ``name(self: T, a: A, b: B = ...) -> R``)."""
    try:
        return list(inspect.signature(inspect.unwrap(fn)).parameters)
    except (TypeError, ValueError):
        pass
    first = (getattr(fn, "__doc__", None) or "").strip().splitlines()[:1]
    m = re.match(r"\w+\((.*)\)", first[0]) if first else None
    if m is None:
        return []
    return re.findall(r"(?:^|, )(\*{0,2}\w+)(?=:|,|$| =)", m.group(1))


def _calls(fn, name: str) -> bool:
    """Whether ``fn``'s own code (under its decorators) names the global ``name``."""
    return name in inspect.unwrap(fn).__code__.co_names


@dataclass(frozen=True)
class Need:
    """One private torch name: ``name`` (dotted, as ccddp reaches it), how to ``get`` it,
    the ``params`` ccddp passes by name (callables), the ``attrs`` it reads or sets, and
    ``why`` ccddp needs it. ``for_groups``: whether a group cannot be made safely without
    it (False for measuring and testing tools). ``probe``: an extra check (True = fine)."""

    name: str
    get: Callable[[], object]
    why: str
    params: tuple[str, ...] = ()
    attrs: tuple[str, ...] = ()
    for_groups: bool = True
    probe: Callable[[object], bool] | None = None

    def problem(self) -> str | None:
        """What is wrong with this name on the running torch (None: nothing)."""
        try:
            obj = self.get()
        except AttributeError:
            return "missing"
        have = _params(obj)
        lost = [p for p in self.params if p not in have]
        if lost:
            return f"has no parameter {', '.join(lost)} (has {', '.join(have) or 'none readable'})"
        lost = [a for a in self.attrs if not hasattr(obj, a)]
        if lost:
            return f"has no attribute {', '.join(lost)}"
        if self.probe is not None and not self.probe(obj):
            return "changed (its check failed)"
        return None


def _backend_options() -> object:
    return c10d._DistributedBackendOptions()


NEEDS: tuple[Need, ...] = (
    # -- the group policy (ccddp.backend.policy) -------------------------------------------
    Need("torch.distributed.distributed_c10d._new_process_group_helper",
         lambda: c10d._new_process_group_helper,
         "every c10d group (init_process_group, new_group, new_subgroups, device meshes) is built by it; "
         "the policy wraps it so that a gloo/NCCL group under a ccddp default group is a ccddp group",
         params=("backend", "backend_options")),
    Need("torch.distributed.distributed_c10d.init_process_group routes through _new_process_group_helper",
         lambda: c10d.init_process_group,
         "if it built groups another way, the policy's wrapper would see none of them",
         probe=lambda fn: _calls(fn, "_new_process_group_helper")),
    Need("torch.distributed.distributed_c10d._new_group_with_tag routes through _new_process_group_helper",
         lambda: c10d._new_group_with_tag,
         "new_group and new_subgroups build their groups through it",
         probe=lambda fn: _calls(fn, "_new_process_group_helper")),
    Need("torch.distributed.distributed_c10d._get_default_group", lambda: c10d._get_default_group,
         "dist.monitored_barrier on a ccddp group (ccddp.backend.policy) resolves group=None as torch does"),
    Need("torch.distributed.distributed_c10d._rank_not_in_group", lambda: c10d._rank_not_in_group,
         "dist.monitored_barrier on a ccddp group leaves non-members to torch", params=("group",)),
    Need("torch.distributed.distributed_c10d.monitored_barrier", lambda: c10d.monitored_barrier,
         "wrapped so that a ccddp group runs gloo's monitored barrier, sealed",
         params=("group", "timeout", "wait_all_ranks")),
    # -- the creator (ccddp.backend.registration._create) ----------------------------------
    Need("torch.distributed.distributed_c10d._DistributedBackendOptions", _backend_options,
         "what torch hands an extended-API backend creator",
         attrs=("store", "group_rank", "group_size", "timeout", "group_id", "global_ranks_in_group")),
    # -- per-device registration (ProcessGroupCCDDP.__init__) ------------------------------
    Need("torch.distributed.ProcessGroup._register_backend", lambda: dist.ProcessGroup._register_backend,
         "pg._get_backend(device) (batch_isend_irecv, coalescing managers) must find ccddp for CPU and CUDA; "
         "also the NCCL wire of device frames (ccddp.comm.ordered)",
         params=("device", "backend_type", "backend")),
    Need("torch.distributed.ProcessGroup._set_default_backend", lambda: dist.ProcessGroup._set_default_backend,
         "the group's default backend type is ccddp's (CUSTOM)", params=("backend_type",)),
    Need("torch.distributed.ProcessGroup._get_backend", lambda: dist.ProcessGroup._get_backend,
         "what torch asks a group for its per-device backend", params=("device",)),
    Need("torch.distributed.ProcessGroup.BackendType.CUSTOM", lambda: dist.ProcessGroup.BackendType.CUSTOM,
         "the backend type of a registered plug-in"),
    Need("torch._C._distributed_c10d.Backend", lambda: _C10D.Backend,
         "the per-device backend object a group registers (a Python subclass where the torch allows one)",
         attrs=("supports_coalescing",)),
    # -- gloo connection sets (ccddp.backend.links) and the guard on plaintext groups -------
    Need("torch.distributed.ProcessGroupGloo.__init__", lambda: dist.ProcessGroupGloo.__init__,
         "ccddp's own links are bare gloo sets; under a ccddp default group the guard refuses every other "
         "gloo group built by a path the policy does not see (a direct constructor, torch.distributed._dist2)"),
    Need("torch.distributed.ProcessGroupGloo._Options", lambda: dist.ProcessGroupGloo._Options(),
         "a trust domain's loopback-bound links", attrs=("_devices", "_timeout")),
    Need("torch.distributed.ProcessGroupGloo.create_device", lambda: dist.ProcessGroupGloo.create_device,
         "a trust domain's loopback-bound links", params=("hostname",)),
    # -- measuring and testing tools (no group depends on them) ------------------------------
    Need("torch.distributed.distributed_c10d._get_default_store", lambda: c10d._get_default_store,
         "the self-test and the adversary share the job's store", for_groups=False),
    Need("torch.distributed._compute_bucket_assignment_by_size", lambda: dist._compute_bucket_assignment_by_size,
         "the DDP bucketing workload reproduces DDP's buckets", for_groups=False),
)

if dist.is_nccl_available():
    NEEDS += (
        Need("torch.distributed.ProcessGroupNCCL.Options", lambda: dist.ProcessGroupNCCL.Options(),
             "the NCCL wire of device frames (ccddp.comm.ordered)", attrs=("_timeout",)),
        Need("torch.distributed.ProcessGroupNCCL._set_sequence_number_for_group",
             lambda: dist.ProcessGroupNCCL._set_sequence_number_for_group,
             "the NCCL wire of device frames, as torch's own group creation sets it up"),
    )


def check(needs: tuple[Need, ...] = NEEDS) -> list[tuple[Need, str]]:
    """Each entry of ``needs`` that the running torch does not provide as used, with why."""
    out = []
    for need in needs:
        problem = need.problem()
        if problem is not None:
            out.append((need, problem))
    return out


def version_problem(version: str | None = None) -> str | None:
    """Why the running torch (or ``version``) is outside ccddp's supported range, if it is."""
    got = torch_release(version)
    if TORCH_MIN <= got < TORCH_BELOW:
        return None
    last = f"{TORCH_BELOW[0]}.{TORCH_BELOW[1] - 1}"
    return (f"ccddp supports torch {TORCH_MIN[0]}.{TORCH_MIN[1]} to {last}; this process runs torch "
            f"{version or torch.__version__} (install a supported torch, or a ccddp release that supports it)")


_REQUIRED_OK = False


def require() -> None:
    """Refuse to make a ccddp group on a torch ccddp cannot hook safely: outside the
    supported range, or missing a private name a group depends on (checked once)."""
    global _REQUIRED_OK
    if _REQUIRED_OK:
        return
    why = version_problem()
    if why is not None:
        raise ConfigError(why)
    broken = check(tuple(n for n in NEEDS if n.for_groups))
    if broken:
        need, problem = broken[0]
        raise ConfigError(f"torch {torch.__version__}: {need.name} {problem}; ccddp needs it because "
                          f"{need.why}, and refuses to create a group rather than run unprotected")
    _REQUIRED_OK = True


@functools.cache
def python_backend_allowed() -> bool:
    """Whether this torch lets a Python class be a c10d ``Backend`` (2.15
    and 2.14 have the constructor; 2.11 to 2.13 do not: "No constructor defined")."""
    class _Probe(_C10D.Backend):
        pass

    try:
        _Probe(0, 1)
    except TypeError:
        return False
    return True


# -- the guard on plaintext groups -------------------------------------------------------------

def _caller_module(depth: int) -> str:
    return sys._getframe(depth + 1).f_globals.get("__name__", "")


def guard_constructor(cls, refuse: Callable[[str], str | None]) -> None:
    """Make every ``cls(...)`` (a pybind11 c10d backend class, whatever name it is reached
    by) ask ``refuse(caller_module)`` first, and raise :class:`ConfigError` with its
    answer when it gives one (idempotent). The pybind11 class is patched itself, so
    ``torch.distributed.X``, ``torch._C._distributed_c10d.X`` and every module that
    imported the name see the same guard."""
    init = cls.__init__
    if getattr(init, "__ccddp_guard__", False):
        return

    def __init__(self, *args, **kwargs):
        why = refuse(_caller_module(1))
        if why is not None:
            raise ConfigError(why)
        init(self, *args, **kwargs)

    __init__.__ccddp_guard__ = True
    __init__.__wrapped__ = init
    cls.__init__ = __init__
