"""Every process a test starts keeps the parent's ``PYTHONPATH`` (issue 38).

The GPU check carries what the GPU image lacks (``cryptography``) in a folder it puts first
on ``PYTHONPATH``; a helper that *replaces* ``PYTHONPATH`` for the ranks it starts makes
them die on import there, while on every development machine (``cryptography`` in
site-packages) the same test passes. Two rules close that class of bug:

- no test module sets ``PYTHONPATH`` without keeping the parent's entries: they go through
  ``dist_util.child_env`` (scanned in the source, so a new helper is caught before it runs);
- a sentinel directory first on ``PYTHONPATH`` is importable in every rank that each kind of
  launch the tests use starts (spawned ranks, torchrun, ``ccddp launch``).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Processes: what a child process inherits is the subject.
from dist_util import child_env, run_ranks
from wire_util import json_rows, torchrun

HERE = Path(__file__).resolve().parent
SENTINEL = "ccddp_pythonpath_sentinel"

# Sites allowed to set PYTHONPATH without keeping the parent's: each on purpose.
DELIBERATE = {
    # the check is given a path whose first entry blocks Triton, to see it stop with one line
    ("test_gpu_check.py", "test_the_check_stops_with_one_line_when_it_cannot_run"),
    # cryptography must import from the wheel folder alone, not from site-packages
    ("test_gpu_check.py", "test_the_wheel_folder_installs_for_the_gpu_python"),
}


def _sets_pythonpath(node: ast.AST) -> ast.AST | None:
    """The value expression if ``node`` puts a PYTHONPATH into an environment, else None."""
    if isinstance(node, ast.Call):
        for kw in node.keywords:
            if kw.arg == "PYTHONPATH":
                return kw.value
        func = node.func
        if (isinstance(func, ast.Attribute) and func.attr in {"setenv", "putenv", "setdefault"} and node.args
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == "PYTHONPATH"):
            return node.args[1] if len(node.args) > 1 else node
    if isinstance(node, ast.Dict):
        for k, v in zip(node.keys, node.values):
            if isinstance(k, ast.Constant) and k.value == "PYTHONPATH":
                return v
    if isinstance(node, ast.Assign):
        for t in node.targets:
            if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) and t.slice.value == "PYTHONPATH":
                return node.value
    return None


def _reads_parent_pythonpath(value: ast.AST) -> bool:
    """Whether the new value is built from the parent's PYTHONPATH (``….get("PYTHONPATH"…)``
    or ``os.environ["PYTHONPATH"]``)."""
    for n in ast.walk(value):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" and n.args \
                and isinstance(n.args[0], ast.Constant) and n.args[0].value == "PYTHONPATH":
            return True
        if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and n.slice.value == "PYTHONPATH":
            return True
    return False


def pythonpath_replacements(tests_dir: Path) -> list[str]:
    """``file:line (function)`` of every place under ``tests_dir`` that sets PYTHONPATH for a
    child without keeping the parent's entries (dist_util's helper and DELIBERATE aside)."""
    bad: list[tuple[str, int, str]] = []
    for path in sorted(tests_dir.rglob("*.py")):
        if path.name in {"dist_util.py", Path(__file__).name}:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        functions = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in ast.walk(tree):
            value = _sets_pythonpath(node)
            if value is None or _reads_parent_pythonpath(value):
                continue
            inside = [f.name for f in functions if f.lineno <= node.lineno <= (f.end_lineno or f.lineno)]
            if any((path.name, name) in DELIBERATE for name in inside):
                continue
            bad.append((str(path.relative_to(tests_dir)), node.lineno, inside[-1] if inside else "module"))
    return [f"{f}:{line} ({fn})" for f, line, fn in sorted(bad)]


def test_no_test_helper_replaces_the_parents_pythonpath():
    bad = pythonpath_replacements(HERE)
    assert not bad, ("these set PYTHONPATH for a child without the parent's entries (the GPU check's wheel "
                     "folder is lost there); build the environment with dist_util.child_env: " + ", ".join(bad))


def test_the_scan_sees_a_replacement_and_accepts_what_keeps_it(tmp_path):
    """The rule above can fail: each way of replacing PYTHONPATH is caught, keeping it is not."""
    (tmp_path / "test_x.py").write_text(
        "import os\n"
        "def a():\n    return dict(os.environ, PYTHONPATH='src')\n"
        "def b(env):\n    env['PYTHONPATH'] = 'src'\n"
        "def c():\n    return {**os.environ, 'PYTHONPATH': 'src'}\n"
        "def d(mp):\n    mp.setenv('PYTHONPATH', 'src')\n"
        "def ok(env):\n    env['PYTHONPATH'] = os.pathsep.join(['src', env.get('PYTHONPATH', '')])\n")
    assert pythonpath_replacements(tmp_path) == ["test_x.py:3 (a)", "test_x.py:5 (b)", "test_x.py:7 (c)",
                                                 "test_x.py:9 (d)"]


@pytest.fixture()
def sentinel_first(tmp_path, monkeypatch):
    """A parent started with a sentinel directory first on PYTHONPATH (as the GPU check
    starts pytest with its wheel folder first): on its path and in its environment."""
    d = tmp_path / "sentinel"
    d.mkdir()
    token = os.urandom(8).hex()
    (d / f"{SENTINEL}.py").write_text(f"TOKEN = {token!r}\n")
    old = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(d)] + ([old] if old else [])))
    monkeypatch.syspath_prepend(str(d))
    return token


RANK_SCRIPT = f"""
import json, os
try:
    import {SENTINEL} as s
    token = s.TOKEN
except ImportError as e:
    token = "missing: " + str(e)
print(json.dumps({{"rank": int(os.environ["RANK"]), "token": token}}), flush=True)
"""


def _sentinel_in_rank(rank, world_size):
    import importlib

    return importlib.import_module(SENTINEL).TOKEN


def test_spawned_ranks_import_from_the_parents_pythonpath(sentinel_first):
    assert run_ranks(_sentinel_in_rank, 2, timeout=120) == [sentinel_first] * 2


@pytest.mark.parametrize("launcher", ["torchrun", "ccddp launch"])
def test_launched_ranks_import_from_the_parents_pythonpath(launcher, sentinel_first, tmp_path):
    script = tmp_path / "rank_main.py"
    script.write_text(RANK_SCRIPT)
    if launcher == "torchrun":
        done = torchrun([str(script)], nproc=2, timeout=300)
    else:
        env = child_env(dict(OMP_NUM_THREADS="1"))
        env.pop("CCDDP_GROUP_SECRET", None)          # a single-node launch makes its own
        done = subprocess.run([sys.executable, "-m", "ccddp.cli", "launch", "--nproc-per-node", "2",
                               str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = json_rows(done.stdout)
    assert sorted(r["rank"] for r in rows) == [0, 1], done.stdout
    assert [r["token"] for r in rows] == [sentinel_first] * 2, rows


def test_child_env_puts_the_checkout_first_and_keeps_the_rest(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/wheels", "/other"]))
    parts = child_env({"X": "1"}, first=("/lead",))["PYTHONPATH"].split(os.pathsep)
    assert parts[0] == "/lead" and parts[1].endswith("src") and parts[-2:] == ["/wheels", "/other"]
    assert json.dumps(child_env({"X": "1"})["X"]) == '"1"'
