"""The ``ccddp`` command line.

Every module ``ccddp.cli.cmd_<name>`` defines ``register(subparsers)``, which adds its
sub-command and sets ``func`` (called with the parsed arguments, returning an exit code).
Adding a command is adding a module; nothing here needs to change.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from ccddp.errors import CCDDPError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ccddp",
        description="Confidential DDP training: secure collectives, their measured and modelled cost.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    import ccddp.cli as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("cmd_"):
            importlib.import_module(f"ccddp.cli.{info.name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CCDDPError as e:
        print(f"ccddp: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ccddp: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
