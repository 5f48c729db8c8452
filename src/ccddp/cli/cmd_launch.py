"""``ccddp launch``: run an unmodified torch.distributed script with its CPU process groups
served by the ``ccddp`` backend.

It is ``torchrun`` with every rank started through ``ccddp.backend.intercept``, which
registers the backend and turns the backend the script asks for (``"gloo"``, or none)
into ``"ccddp"`` before running the script; all torchrun options work as usual. Without
key material in the environment, a single-node launch gets a fresh group secret; a
multi-node one must set ``CCDDP_GROUP_SECRET`` (or identity keys) on every node.

Example::

    $ ccddp launch --nproc-per-node 2 examples/ddp_tutorial.py --steps 5
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


def torchrun_argv(argv: list[str]) -> list[str]:
    """torchrun's arguments with the script (or ``-m MODULE``) started through the interceptor."""
    from torch.distributed.run import get_args_parser

    ns = get_args_parser().parse_args(argv)
    if ns.no_python:
        raise ConfigError("ccddp launch runs Python scripts: --no-python is not supported")
    rest = list(ns.training_script_args)
    at = len(argv) - len(rest) - 1
    if at < 0 or argv[at] != ns.training_script:
        raise ConfigError(f"cannot find the script {ns.training_script!r} among the arguments")
    head = [a for a in argv[:at] if a not in ("-m", "--module")]
    target = ["-m", ns.training_script] if ns.module else [ns.training_script]
    return [*head, "-m", INTERCEPT, *target, *rest]


def _single_node(argv: list[str]) -> bool:
    from torch.distributed.run import get_args_parser

    ns = get_args_parser().parse_args(argv)
    return ns.standalone or str(ns.nnodes) in ("1", "1:1")


def run(args: argparse.Namespace) -> int:
    from ccddp.crypto.keys import ENV_SECRET, ENV_SECRET_FILE, GroupSecret

    argv = list(args.torchrun_args)
    if not argv:
        raise ConfigError("usage: ccddp launch [torchrun options] SCRIPT [ARGS]")
    env = dict(os.environ)
    keyed = env.get(ENV_SECRET) or env.get(ENV_SECRET_FILE) or env.get("CCDDP_IDENTITY")
    if not keyed:
        if not _single_node(argv):
            raise ConfigError(f"a multi-node launch needs the same key material on every node: set {ENV_SECRET} "
                              "(or CCDDP_IDENTITY and CCDDP_ALLOWLIST)")
        env[ENV_SECRET] = GroupSecret.generate().value.hex()
    # torchrun in a session of its own: Ctrl-C or SIGTERM to this command ends every rank.
    from ccddp.bench.launch import supervised

    return supervised([sys.executable, "-m", "torch.distributed.run", *torchrun_argv(argv)], env).returncode
