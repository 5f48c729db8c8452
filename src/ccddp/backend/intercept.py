"""What ``ccddp launch`` runs in every rank: the ``ccddp`` backend in place of gloo, then
the user's script, unmodified.

Before the script runs, :func:`install` (1) registers the ``ccddp`` backend, (2) makes it
the default CPU backend (``init_process_group()`` without a backend, device meshes), and
(3) wraps ``torch.distributed.init_process_group`` and ``new_group`` so a backend the
script names is served by ccddp: ``"gloo"`` becomes ``"ccddp"``, ``"cpu:gloo"`` becomes
``"cpu:ccddp"``. A backend ccddp cannot seal (NCCL for GPU tensors, MPI, UCC) stops the
run with a ConfigError instead of running in plaintext. Nothing else changes: the script
is run as ``python SCRIPT ARGS`` (or ``python -m MODULE ARGS``) would run it.

Example (what ``ccddp launch --nproc-per-node 2 train.py --epochs 1`` asks torchrun for)::

    torchrun --nproc-per-node 2 -m ccddp.backend.intercept train.py --epochs 1
"""

from __future__ import annotations

import functools
import os
import runpy
import sys

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ccddp.backend.registration import BACKEND_NAME, register
from ccddp.errors import CCDDPError, ConfigError


def secure_backend(backend: str | None) -> str | None:
    """The backend string to use instead of ``backend`` (None stays None: the default map
    then picks ccddp for CPU)."""
    if backend is None or str(backend).lower() == "undefined":
        if torch.cuda.is_available():
            raise ConfigError("this script lets torch pick NCCL for GPU tensors; ccddp seals CPU tensors only")
        return backend
    parts = []
    for part in str(backend).lower().split(","):
        device, _, name = part.rpartition(":")
        if name == "gloo":
            name = BACKEND_NAME
        if name != BACKEND_NAME:
            raise ConfigError(f"this script asks for the {name} backend, which ccddp cannot seal "
                              "(ccddp serves CPU process groups, in place of gloo)")
        parts.append(f"{device}:{name}" if device else name)
    return ",".join(parts)


def _rewriting(fn, position: int):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if len(args) > position:
            args = (*args[:position], secure_backend(args[position]), *args[position + 1:])
        elif "backend" in kwargs:
            kwargs["backend"] = secure_backend(kwargs["backend"])
        elif fn.__name__ == "init_process_group":
            kwargs["backend"] = secure_backend(None)
        return fn(*args, **kwargs)

    wrapper.__ccddp_intercepted__ = True
    return wrapper


def install() -> None:
    """Serve the process's CPU groups with ccddp (idempotent)."""
    register()
    dist.Backend.default_device_backend_map["cpu"] = BACKEND_NAME
    for name, position in (("init_process_group", 0), ("new_group", 2)):
        fn = getattr(c10d, name)
        if not getattr(fn, "__ccddp_intercepted__", False):
            wrapped = _rewriting(fn, position)
            setattr(c10d, name, wrapped)
            setattr(dist, name, wrapped)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        raise SystemExit("usage: python -m ccddp.backend.intercept (SCRIPT | -m MODULE) [ARGS ...]")
    install()
    try:
        if argv[0] == "-m":
            sys.argv = argv[1:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except CCDDPError as e:
        print(f"ccddp: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
