"""What ``ccddp launch`` runs in every rank: the ``ccddp`` backend in place of gloo, then
the user's script, unmodified.

Before the script runs, :func:`install` (1) registers the ``ccddp`` backend, (2) makes it
the default CPU and CUDA backend (``init_process_group()`` without a backend, device
meshes), and (3) wraps ``torch.distributed.init_process_group`` so the backend the script
names is served by ccddp: ``"gloo"`` and ``"nccl"`` become ``"ccddp"``,
``"cpu:gloo,cuda:nccl"`` becomes ``"cpu:ccddp,cuda:ccddp"``. A backend ccddp cannot seal
(MPI, UCC) stops the run with a ConfigError instead of running in plaintext. Groups made later (``new_group``, device
meshes) follow the same rule, as under any ccddp default group (``ccddp.backend.policy``).
The group secret is taken out of the environment before the script runs, so nothing the
script starts inherits it. What torch's and ccddp's imports made is moved out of the cycle
collector's reach before the script starts (``ccddp.startup``); the script runs with the
collector on, as always. Nothing else changes: the script is run as ``python SCRIPT
ARGS`` (or ``python -m MODULE ARGS``) would run it.

Example (what ``ccddp launch --nproc-per-node 2 train.py --epochs 1`` asks torchrun for:
torchrun's own ``main``, started as ``python -m ccddp.bench.agent``, on the static rendezvous)::

    torchrun --nproc-per-node 2 --master-addr 127.0.0.1 --master-port PORT \
        -m ccddp.backend.intercept train.py --epochs 1
"""

from __future__ import annotations

import functools
import os
import runpy
import sys

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ccddp.backend.policy import secure_backend
from ccddp.backend.registration import BACKEND_NAME, register
from ccddp.crypto.keys import take_secret_from_env
from ccddp.errors import CCDDPError
from ccddp.launched import check_world_size
from ccddp.startup import freeze_imports


def _rewriting(fn):
    @functools.wraps(fn)
    def init_process_group(*args, **kwargs):
        if args:
            args = (secure_backend(args[0]), *args[1:])
        else:
            kwargs["backend"] = secure_backend(kwargs.get("backend"))
        return fn(*args, **kwargs)

    init_process_group.__ccddp_intercepted__ = True
    return init_process_group


def install() -> None:
    """Serve the process's CPU and CUDA groups with ccddp (idempotent)."""
    register()
    dist.Backend.default_device_backend_map["cpu"] = BACKEND_NAME
    dist.Backend.default_device_backend_map["cuda"] = BACKEND_NAME
    fn = c10d.init_process_group
    if not getattr(fn, "__ccddp_intercepted__", False):
        c10d.init_process_group = dist.init_process_group = _rewriting(fn)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        raise SystemExit("usage: python -m ccddp.backend.intercept (SCRIPT | -m MODULE) [ARGS ...]")
    install()
    try:
        check_world_size()      # the job's size as the launch says it, not as the host's store does
        # Before the script starts anything that would inherit the environment.
        take_secret_from_env()
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
    freeze_imports()    # torch's and ccddp's import-time objects, out of the collector's reach (ccddp.startup)
    main()
