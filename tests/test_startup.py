"""How a process ccddp starts imports (``ccddp.startup``): without the cycle collector, then
with what it imported frozen out of the collector's reach -- only where the module runs as
the program; imported as a library, nothing changes. And every module ccddp starts as a
process (torchrun's agent, the ranks of its commands) does so."""

from __future__ import annotations

import ast
import gc
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import ccddp
from ccddp.bench.launch import AGENT
from ccddp.startup import pause_collector, resume_collector

SRC = Path(ccddp.__file__).resolve().parent

ENTRY = textwrap.dedent("""
    import gc, json, sys
    from ccddp.startup import pause_collector
    pause_collector(__name__)
    paused = not gc.isenabled()
    import decimal, email.message             # imports made while paused
    from ccddp.bench.worker import run_worker

    def main():
        print(json.dumps({"paused": paused, "collecting": gc.isenabled(), "frozen": gc.get_freeze_count()}))

    run_worker(main)
""")


def test_a_module_run_as_the_program_imports_without_the_collector_then_freezes_them():
    done = subprocess.run([sys.executable, "-c", ENTRY], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RANK": "0"})
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout)
    assert seen["paused"] and seen["collecting"], seen
    assert seen["frozen"] > 1000, seen          # the imports' objects, moved out of the collector's reach


def test_a_module_imported_as_a_library_changes_nothing():
    frozen = gc.get_freeze_count()
    assert gc.isenabled()
    pause_collector("ccddp.bench.train")
    assert gc.isenabled()
    resume_collector()
    assert gc.isenabled() and gc.get_freeze_count() == frozen


def _started_modules() -> set[str]:
    """The modules ccddp starts as processes of its own: ``torchrun("ccddp.…", ...)``
    anywhere in the package, and the agent that runs torchrun."""
    found = {AGENT}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "torchrun" and node.args
                    and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("ccddp.")):
                found.add(node.args[0].value)
    return found


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == name]


def test_every_module_ccddp_starts_pauses_the_collector_before_torch_and_resumes_it():
    """``ccddp launch``'s wrapper cannot pause it (its package loads torch first): it freezes
    before the script runs, which tests/test_safe_launch.py checks in a launched script."""
    started = _started_modules()
    assert {"ccddp.bench.train", "ccddp.bench.collectives", "ccddp.bench.selftest",
            "ccddp.bench.calibrate", AGENT} <= started, started
    for module in sorted(started):
        tree = ast.parse((SRC.parent / (module.replace(".", "/") + ".py")).read_text())
        pause = [c for c in _calls(tree, "pause_collector")
                 if len(c.args) == 1 and getattr(c.args[0], "id", None) == "__name__"]
        assert pause, f"{module} does not call pause_collector(__name__)"
        heavy = [n.lineno for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
                 and any((a.name if isinstance(n, ast.Import) else n.module or "").split(".")[0] in ("torch", "numpy")
                         for a in n.names)]
        assert heavy and pause[0].lineno < min(heavy), f"{module}: pause_collector after its first torch import"
        assert _calls(tree, "run_worker") or _calls(tree, "resume_collector"), f"{module} never resumes it"
