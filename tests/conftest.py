"""Test selection: every test is marked ``unit``, ``multiprocess`` or ``soak``, automatically,
unless its module marks it ``exhaustive`` itself.

- ``soak``: modules named ``test_soak*`` (long repetition on real ranks);
- ``multiprocess``: a test that starts processes -- it, a fixture it uses, or a function of
  its module it calls (transitively) uses ``run_ranks``/``spawn`` (the rank helpers),
  ``subprocess``, ``multiprocessing``, ``torchrun``, or runs a ``ccddp`` command that
  launches ranks through the in-process CLI (``main(["train", ...])``,
  ``ccddp_here("launch", ...)``); ranks as threads
  (``tests/thread_ranks.py``, imported as ``run_ranks``) count here too: they take seconds;
- ``unit``: everything else (one process, seconds);
- ``exhaustive`` (given by the test module): one process, but the rest of a table of cases
  whose every code path the fast tier already runs once -- the NIST vectors' shorter tags
  through Triton's interpreter, the larger model of each family in the projection table.

A test may carry one of these marks itself; then it is left as it is. ``multiprocess``,
``soak`` and ``exhaustive`` tests are also marked ``slow``. Run ``pytest -m "not slow"``
(or ``-m unit``) for the fast tier, ``pytest -m "not soak"`` to skip the soak.

Under ``-n`` (pytest-xdist) without ``--dist``, tests are distributed as ``loadgroup``, and
the tests of a module that read a fixture it makes once (module scope: a launch, a report)
form one group, run by one worker, so that fixture is made once, not once per worker.
"""

import ast
import functools
import gc
import os
import sys

import pytest

# Rank functions live in test modules; spawned ranks import them from here.
sys.path.insert(0, os.path.dirname(__file__))

# pytest keeps each test module's assertion-rewritten bytecode beside it, unless
# PYTHONDONTWRITEBYTECODE is set (this project's machines set it): then every pytest process
# (each xdist worker, each run) rewrote all ~120 test modules again, ~3 s of its collection.
# Only this process: the processes tests start keep the variable. Imports here find ccddp's
# and the test helpers' bytecode written already (``_compile_for_children``).
sys.dont_write_bytecode = False


MARKS = {
    "unit": "one process, no ranks: fast",
    "multiprocess": "starts processes (ranks, torchrun, the ccddp command)",
    "soak": "long repetition on real ranks",
    "exhaustive": "one process, the rest of a table whose every code path the fast tier runs once",
    "slow": "multiprocess, soak or exhaustive: deselect with -m 'not slow' for the fast tier",
}
#: Marks whose tests are also ``slow``.
SLOW = ("multiprocess", "soak", "exhaustive")
#: Names whose use means "starts processes".
SPAWNING_NAMES = {"run_ranks", "run_process_ranks", "run_thread_ranks", "spawn", "torchrun", "subprocess", "multiprocessing", "mp", "Popen"}
#: ccddp commands that launch ranks.
LAUNCHING_COMMANDS = {"train", "bench", "characterize", "selftest", "calibrate", "validate", "launch"}


@pytest.hookimpl(tryfirst=True)          # before xdist's, which turns an unset --dist into "load"
def pytest_cmdline_main(config):
    """``-n`` without ``--dist`` distributes as ``loadgroup``: tests one at a time to
    whichever worker is free (xdist's default, ``load``), except those that share a
    ``xdist_group`` mark, which one worker runs together -- tests that read one launch
    through a module fixture (which each worker would otherwise run for itself)."""
    if getattr(config.option, "numprocesses", None) and getattr(config.option, "dist", None) == "no":
        config.option.dist = "loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    # A worker parses the command line afresh (no ``--dist`` there): tell it the mode.
    node.workerinput["ccddp_dist"] = node.config.option.dist


def pytest_configure(config):
    _choose_triton_mode(config)
    for name, text in MARKS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    # Known without xdist too (``-p no:xdist``), where the grouping below changes nothing.
    config.addinivalue_line("markers", "xdist_group(name): run on one xdist worker with its group")
    if not hasattr(config, "workerinput"):     # once, in pytest's own process (not per xdist worker)
        _compile_for_children()
    elif config.workerinput.get("ccddp_dist") == "loadgroup":
        config.option.loadgroup = True          # what xdist sets from an explicit --dist loadgroup


def _choose_triton_mode(config) -> None:
    """Triton chooses compiled or interpreted kernels once, when it is first imported:
    without a GPU the device AES-GCM tests run its kernels through the interpreter, decided
    here, in every process that runs tests, before collection imports any test module (or
    library) that could import Triton. Ranks a test spawns inherit the choice (an
    environment variable). Not in xdist's controller, which runs no test: the choice asks
    torch whether a GPU exists, and importing torch there held back the start of every
    worker (a ``-n`` run took ~2 s longer, BENCHMARKS.md)."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        from ccddp.crypto.device import interpreting

        interpreting()


def _compile_for_children() -> None:
    """Bytecode for ccddp and the test modules, written before any test starts a process.
    Every rank, torchrun agent and CLI run a test starts imports them afresh, and where
    ``PYTHONDONTWRITEBYTECODE`` is set (this project's machines set it) none of those
    processes may keep what it compiled: each compiled the same ~100 modules again (~0.3 s
    a rank). ``compileall`` writes regardless; an import still checks each file's source
    against the bytecode it reads, so an edited file is never run stale."""
    import compileall

    import ccddp

    for where in (os.path.dirname(ccddp.__file__), os.path.dirname(__file__)):
        try:
            compileall.compile_dir(where, quiet=1)
        except OSError:     # a read-only checkout: the processes compile for themselves, as before
            pass


def _spawns_directly(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in SPAWNING_NAMES:
            return True
        if isinstance(n, ast.Attribute) and n.attr in {"Popen", "spawn", "start_processes"}:
            return True
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in {"main", "cli_main"}
                and n.args and isinstance(n.args[0], (ast.List, ast.Tuple)) and n.args[0].elts
                and isinstance(n.args[0].elts[0], ast.Constant) and n.args[0].elts[0].value in LAUNCHING_COMMANDS):
            return True
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "ccddp_here"
                and n.args and isinstance(n.args[0], ast.Constant) and n.args[0].value in LAUNCHING_COMMANDS):
            return True     # the same command through the fixture (``ccddp_here("launch", ...)``)
    return False


@functools.lru_cache(maxsize=None)
def _spawning_functions(path: str) -> frozenset[str]:
    """Names of the module's functions (tests, fixtures, helpers) that start processes,
    directly or through another function of the module."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    defs = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    calls = {name: {x.id for x in ast.walk(node) if isinstance(x, ast.Name) and x.id in defs}
             for name, node in defs.items()}
    spawning = {name for name, node in defs.items() if _spawns_directly(node)}
    grew = True
    while grew:
        more = {name for name, used in calls.items() if used & spawning} - spawning
        spawning |= more
        grew = bool(more)
    return frozenset(spawning)


@pytest.fixture
def ccddp_here(capsys):
    """``ccddp ARGV`` in this test's process, for a command that must stop before it starts
    anything (a refusal, a usage error): ``run(*argv) -> (exit status, stderr)``, without a
    fresh interpreter (~1.5 s each). A command wrongly let through still starts its
    torchrun and ranks as processes, where the test sees them."""
    def run(*argv: str) -> tuple[int, str]:
        from ccddp.cli import main

        capsys.readouterr()
        try:
            code = main(list(argv))
        except SystemExit as e:     # argparse's own usage errors
            code = e.code
        return code, capsys.readouterr().err

    return run


@pytest.hookimpl(tryfirst=True)          # the marks exist before xdist's worker reads them
def pytest_collection_finish(session):
    """The garbage collector of a pytest process, tuned for a test run: what collection left
    (torch, the test modules, ~1M objects) moves out of its reach (``gc.freeze``), and it
    runs every 50,000 allocations instead of 700. Before, each full collection walked all of
    it again, 12-15 times a worker in the fast tier: ~3 s of a worker's CPU went to the
    collector (1 s now, mostly pytest's own collections at the end). A test's own objects
    are collected as before; the processes tests start keep Python's defaults."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def pytest_collection_modifyitems(config, items):
    for item in items:
        _mark(item)
        if any(item.get_closest_marker(m) for m in SLOW) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
        _group_by_shared_fixture(item)


def _group_by_shared_fixture(item) -> None:
    """A test that reads a fixture its module makes once (a launch, a report: module
    scope) joins its module's ``xdist_group`` (see :func:`pytest_cmdline_main`): tests
    split over workers would have each worker make it again."""
    module = item.nodeid.split("::")[0]
    infos = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        defs = infos.name2fixturedefs.get(name) if infos else None
        if defs and defs[-1].scope in ("module", "class") and defs[-1].baseid == module:
            item.add_marker(pytest.mark.xdist_group(module))
            return


def _mark(item) -> None:
    if any(item.get_closest_marker(m) for m in MARKS if m != "slow"):
        return
    path = str(item.fspath)
    if os.path.basename(path).startswith("test_soak"):
        item.add_marker(pytest.mark.soak)
        return
    spawning = _spawning_functions(path)
    names = {getattr(item, "originalname", item.name)} | set(getattr(item, "fixturenames", ()))
    item.add_marker(pytest.mark.multiprocess if names & spawning else pytest.mark.unit)
