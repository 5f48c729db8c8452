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
from pathlib import Path

from ccddp.errors import CCDDPError, ConfigError


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


def prepare_json_output(args: argparse.Namespace) -> None:
    """Create the directory of ``--json PATH`` now: commands write it at their end, some
    after hours of runs, and a missing directory must not lose the result."""
    path = getattr(args, "json", None)
    if path:
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot write {path}: {e.strerror or e}") from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        prepare_json_output(args)
        return int(args.func(args) or 0)
    except CCDDPError as e:
        print(f"ccddp: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ccddp: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
