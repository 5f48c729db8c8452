"""A ccddp group as its own per-device c10d ``Backend`` (torch's registration, issue 39).

torch asks a group for its backend per device (``_get_backend``, ``_get_backend_name``,
``batch_isend_irecv`` from torch 2.15, the coalescing managers). :func:`register_device_backends`
registers, for ``cpu`` and ``cuda``, one ``Backend`` whose every op is the group's own
(sealed) method, so ``pg._get_backend(device).allreduce(...)`` and ``pg.allreduce(...)``
are the same op.

Example::

    register_device_backends(pg, ops)     # ProcessGroupCCDDP.__init__ does this (its op names)
    pg._get_backend(torch.device("cpu")).allreduce([t])    # pg.allreduce([t])
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist

from ccddp.errors import ConfigError


def _device_backend_class(ops: tuple[str, ...]):
    """The per-device c10d ``Backend`` of a ccddp group: each of ``ops`` is the group's
    own method. It coalesces nothing and splits nothing, as gloo (``batch_isend_irecv``
    then posts each message on its own, as it does on gloo)."""
    from ccddp.backend.torch_private import _C10D

    class DeviceBackend(_C10D.Backend):
        # Plain attributes: the pybind11 properties of these would call back into Python
        # for the override and recurse.
        supports_coalescing = False
        supports_splitting = False
        supports_time_estimate = False
        supports_tensor_alloc = False
        supports_shrinking = False

        def __init__(self, group) -> None:
            super().__init__(group.rank(), group.size())
            self._name = group.getBackendName()
            self._group = weakref.ref(group)  # the group holds the backend, not the other way round

        def _of(self):
            group = self._group()
            if group is None:
                raise ConfigError("this ccddp backend's process group was destroyed")
            return group

        def getBackendName(self) -> str:
            return self._name

        def name(self) -> str:
            return self._name

    def forward(op: str):
        def call(self, *args, **kwargs):
            return getattr(self._of(), op)(*args, **kwargs)

        call.__name__ = op
        return call

    for op in ops:
        setattr(DeviceBackend, op, forward(op))
    return DeviceBackend


_DEVICE_BACKEND = None


def register_device_backends(group, ops: tuple[str, ...]) -> None:
    """Register ``group`` as its own CPU and CUDA backend, the way torch's groups are
    (``_register_backend`` per device, ``_set_default_backend``), forwarding ``ops`` (the
    c10d method names) to it. Torches that cannot host a Python ``Backend`` (2.11 to
    2.13) do not ask this of a Python group; there the group stays as it was
    (``_get_backend`` does not resolve)."""
    global _DEVICE_BACKEND
    from ccddp.backend.torch_private import python_backend_allowed

    if not python_backend_allowed():
        return
    if _DEVICE_BACKEND is None:
        _DEVICE_BACKEND = _device_backend_class(ops)
    backend = _DEVICE_BACKEND(group)
    group._device_backend = backend  # kept alive with the group: torch's reference is C++ only
    custom = dist.ProcessGroup.BackendType.CUSTOM
    for device in ("cpu", "cuda"):
        group._register_backend(torch.device(device), custom, backend)
    group._set_default_backend(custom)
