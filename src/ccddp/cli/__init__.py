"""The ``ccddp`` command line.

Every module ``ccddp.cli.cmd_<name>`` defines ``register(subparsers)``, which adds the
sub-command ``<name>`` and sets ``func`` (called with the parsed arguments, returning an
exit code). Adding a command is adding a module; nothing here needs to change.

The command line answers fast: importing a ``cmd_`` module must not import torch (a
command imports what it needs inside the function that runs it), and a module that
defines ``SUMMARY`` (its one-line help) is registered only when its command is the one
given, so ``ccddp --help`` and a mistyped command build no command's options at all.
Every option's default is shown in ``--help``.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from pathlib import Path

from ccddp.errors import CCDDPError, ConfigError

DESCRIPTION = ("Confidential DDP training for PyTorch: every gradient exchange sealed with AES-GCM; "
               "measure what that costs on this machine and predict it on GPUs.")


class HelpFormatter(argparse.HelpFormatter):
    """argparse's layout plus ``(default: X)`` after every option that has a default its
    help does not state already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or text == argparse.SUPPRESS or "default" in text.lower()
                or action.default in (None, False, argparse.SUPPRESS)):
            return text
        return f"{text} (default: %(default)s)"


class VerbatimHelpFormatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """:class:`HelpFormatter` that keeps the description's and epilog's line breaks (for
    commands whose epilog is a table or a list)."""


class SubCommands(argparse._SubParsersAction):
    """Sub-commands whose ``--help`` opens with their one-line help when they give no
    description of their own."""

    def add_parser(self, name, **kwargs):
        if kwargs.get("help") and not kwargs.get("description"):
            kwargs["description"] = kwargs["help"][:1].upper() + kwargs["help"][1:] + "."
        return super().add_parser(name, **kwargs)


class Parser(argparse.ArgumentParser):
    """Every ccddp (sub)parser: defaults shown, sub-commands described, a usage error in
    one line."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", SubCommands)

    #: The sub-command the top-level parser was built for (argparse reports an unknown
    #: option of a sub-command from the top level).
    command: str | None = None

    def error(self, message: str):
        """``ccddp: error: MESSAGE (PROG --help)`` and exit 2, as every other refusal of a
        ccddp command reads; argparse's own prints the whole usage block first."""
        prog = f"{self.prog} {self.command}" if self.command and message.startswith("unrecognized") else self.prog
        self.exit(2, f"ccddp: error: {message} (see {prog} --help)\n")


def commands() -> dict[str, str]:
    """Sub-command name -> module, sorted by name."""
    import ccddp.cli as pkg

    return {info.name.removeprefix("cmd_"): f"ccddp.cli.{info.name}"
            for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name)
            if info.name.startswith("cmd_")}


def command_word(argv: list[str]) -> str | None:
    """The sub-command ``argv`` names: its first word that is not an option (the top
    level has no option that takes a value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv`` (default: this process's arguments): the command it names is
    registered in full; the others, when their module has a ``SUMMARY``, only by name."""
    chosen = command_word(sys.argv[1:] if argv is None else argv)
    parser = Parser(prog="ccddp", description=DESCRIPTION)
    parser.command = chosen if chosen in commands() else None
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for name, module_name in commands().items():
        module = importlib.import_module(module_name)
        summary = getattr(module, "SUMMARY", None)
        if name == chosen or summary is None:
            module.register(sub)
        else:
            sub.add_parser(name, help=summary)
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


#: What the ``bench`` extra installs (pyproject.toml), by import name: a command that
#: needs one of them on a core install says which extra to install instead of a traceback.
BENCH_EXTRA_MODULES = frozenset({"transformers", "torch_geometric", "matplotlib", "scipy"})


def missing_extra(e: ModuleNotFoundError, command: str | None) -> str | None:
    """The one-line answer to a command that needs the ``bench`` extra, or None when the
    missing module is not one of the extra's."""
    name = (e.name or "").split(".")[0]
    if name not in BENCH_EXTRA_MODULES:
        return None
    return (f"`ccddp {command}` needs the measuring tools (no module named {name!r}): "
            "pip install 'ccddp[bench]' (from a checkout: pip install -e '.[bench]')")


def require_modules(*names: str) -> None:
    """Raise :class:`ModuleNotFoundError` for the first of ``names`` that is not installed,
    found without importing it (answered by :func:`missing_extra` as its import would be):
    for a command whose parent does not load what its ranks will."""
    import importlib.util

    for name in names:
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def main(argv: list[str] | None = None) -> int:
    args = build_parser(argv).parse_args(argv)
    try:
        prepare_json_output(args)
        return int(args.func(args) or 0)
    except CCDDPError as e:
        print(f"ccddp: error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        answer = missing_extra(e, args.command)
        if answer is None:
            raise
        print(f"ccddp: error: {answer}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ccddp: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
