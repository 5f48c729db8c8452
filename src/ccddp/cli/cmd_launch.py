"""``ccddp launch``: run an unmodified torch.distributed script with its CPU process groups
served by the ``ccddp`` backend.

It is ``torchrun`` with every rank started through ``ccddp.backend.intercept``, which
registers the backend and turns the backend the script asks for (``"gloo"``, or none)
into ``"ccddp"`` before running the script. Without key material in the environment, a
single-node launch gets a fresh group secret; a multi-node one must set
``CCDDP_GROUP_SECRET`` (or identity keys) on every node.

Rendezvous: torchrun's static rendezvous only. The dynamic ones (``c10d``, ``etcd``, and
the ``c10d`` rendezvous torchrun picks by itself for ``--standalone`` or a single node
without ``--master-port``) keep their state in the rendezvous store as a pickle and
unpickle what they read back; the store belongs to the host, so a host that writes a
crafted pickle there would run code in the agent, which holds the group secret. A
single-node launch is therefore given ``--master-addr 127.0.0.1`` and a free
``--master-port``; a multi-node launch names them itself, with ``--nnodes N --node-rank
R``; a dynamic backend, or a range of nodes (which only a dynamic rendezvous serves), is
refused before anything starts. ``--max-restarts`` works: a restarted attempt builds new
links and a new session.

Example::

    $ ccddp launch --nproc-per-node 2 examples/ddp_tutorial.py --steps 5
    $ ccddp launch --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 \
          --nproc-per-node 4 train.py          # the same on the other node with --node-rank 1
"""

from __future__ import annotations

import argparse
import os
import sys

from ccddp.errors import ConfigError

INTERCEPT = "ccddp.backend.intercept"

SUMMARY = "run an unmodified DDP script (torchrun arguments) with ccddp as its backend"


def register(sub) -> None:
    # No option of its own: every argument, dashes included, is torchrun's (``--help`` too).
    p = sub.add_parser("launch", prefix_chars="\0", add_help=False,
                       help=SUMMARY,
                       description="torchrun, with every rank's CPU process groups served by the ccddp backend: "
                                   "ccddp launch [torchrun options] SCRIPT [script arguments]. The script's "
                                   "init_process_group('gloo') (or no backend) becomes 'ccddp'; nothing else "
                                   "changes.")
    p.add_argument("torchrun_args", nargs=argparse.REMAINDER, metavar="[torchrun options] SCRIPT [ARGS]")
    p.set_defaults(func=run)


STATIC_HOW = "--nnodes N --node-rank R --master-addr HOST --master-port PORT"


def _parse(argv: list[str]) -> argparse.Namespace:
    from torch.distributed.run import get_args_parser

    return get_args_parser().parse_args(argv)


def _node_range(ns: argparse.Namespace) -> tuple[int, int]:
    from torch.distributed.run import parse_min_max_nnodes

    try:
        return tuple(parse_min_max_nnodes(str(ns.nnodes)))
    except (ValueError, RuntimeError) as e:
        raise ConfigError(f"--nnodes {ns.nnodes!r} is not a number of nodes: {e}") from None


def static_rendezvous(ns: argparse.Namespace) -> list[str]:
    """The options to add so torchrun uses the static rendezvous (nothing it reads from the
    store is unpickled); raises :class:`ConfigError` for a launch that needs a dynamic one."""
    if ns.rdzv_backend != "static":
        raise ConfigError(f"ccddp launch does not use the {ns.rdzv_backend} rendezvous: it unpickles what it reads "
                          f"from the rendezvous store, which the host controls. Use the static rendezvous: "
                          f"{STATIC_HOW} on every node")
    low, high = _node_range(ns)
    if low != high:
        raise ConfigError(f"--nnodes {ns.nnodes}: a range of nodes needs a dynamic rendezvous, which ccddp launch "
                          f"does not use (it unpickles what the host's store holds); give a fixed count: {STATIC_HOW}")
    if ns.master_port is not None or ns.rdzv_endpoint:
        return []
    if high > 1:
        raise ConfigError(f"a multi-node launch needs the address of node 0: {STATIC_HOW}")
    # Without a port torchrun would switch a one-node launch to the c10d rendezvous.
    from ccddp.bench.launch import free_port

    return ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]


def torchrun_argv(argv: list[str]) -> list[str]:
    """torchrun's arguments: the static rendezvous, and the script (or ``-m MODULE``)
    started through the interceptor."""
    ns = _parse(argv)
    if ns.no_python:
        raise ConfigError("ccddp launch runs Python scripts: --no-python is not supported")
    rest = list(ns.training_script_args)
    at = len(argv) - len(rest) - 1
    if at < 0 or argv[at] != ns.training_script:
        raise ConfigError(f"cannot find the script {ns.training_script!r} among the arguments")
    # --standalone is torchrun's c10d rendezvous on this node: the static one replaces it.
    head = [a for a in argv[:at] if a not in ("-m", "--module", "--standalone")]
    if ns.standalone:
        ns.rdzv_backend, ns.rdzv_endpoint = "static", ""
    target = ["-m", ns.training_script] if ns.module else [ns.training_script]
    return [*head, *static_rendezvous(ns), "-m", INTERCEPT, *target, *rest]


def _single_node(argv: list[str]) -> bool:
    ns = _parse(argv)
    return ns.standalone or _node_range(ns)[1] == 1


def run(args: argparse.Namespace) -> int:
    from ccddp.crypto.keys import ENV_SECRET, ENV_SECRET_FILE, GroupSecret

    argv = list(args.torchrun_args)
    if not argv:
        raise ConfigError("usage: ccddp launch [torchrun options] SCRIPT [ARGS]")
    cmd = [sys.executable, "-m", "torch.distributed.run", *torchrun_argv(argv)]
    env = dict(os.environ)
    keyed = env.get(ENV_SECRET) or env.get(ENV_SECRET_FILE) or env.get("CCDDP_IDENTITY")
    if not keyed:
        if not _single_node(argv):
            raise ConfigError(f"a multi-node launch needs the same key material on every node: set {ENV_SECRET} "
                              "(or CCDDP_IDENTITY and CCDDP_ALLOWLIST)")
        env[ENV_SECRET] = GroupSecret.generate().value.hex()
    # torchrun in a session of its own: Ctrl-C or SIGTERM to this command ends every rank.
    from ccddp.bench.launch import supervised

    return supervised(cmd, env).returncode
