"""The core install (``pip install ccddp``, no extras): the backend, ``ccddp launch``,
``ccddp selftest`` and ``ccddp simulate`` work; a command that needs the ``bench`` extra
says so in one line (exit 2, no traceback).

What the core install lacks is read from pyproject.toml (the ``bench`` extra's packages
that the core dependencies do not list) and hidden from every process a command starts,
by a ``sitecustomize`` first on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SECRET = "4c7e19b2d8a05f36e1c94b7a2d6f803e5b1c9a7d2e4f6083b5a7c9e1d3f50b28"

_BLOCKER = '''
import sys
BLOCKED = {blocked!r}
class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _NotInstalled())
'''


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r.strip(), maxsplit=1)[0].lower().replace("-", "_") for r in requirements}


def not_in_core() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bench = _names(project["optional-dependencies"]["bench"]) - {"ccddp"}
    return bench - _names(project["dependencies"])


@pytest.fixture
def core_env(tmp_path):
    blocked = sorted(not_in_core())
    assert {"transformers", "matplotlib"} <= set(blocked)       # the extra is really hidden
    (tmp_path / "sitecustomize.py").write_text(_BLOCKER.format(blocked=blocked))
    parts = [str(tmp_path), str(ROOT / "src")] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(parts), CCDDP_GROUP_SECRET=SECRET, OMP_NUM_THREADS="1")


def _ccddp(env, *args, timeout=240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ccddp.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_simulate_runs_on_the_core_install(core_env):
    r = _ccddp(core_env, "simulate", "--workload", "bert-base", "--gpus", "8")
    assert r.returncode == 0 and "bert-base" in r.stdout, r.stderr[-2000:]


def test_selftest_runs_on_the_core_install(core_env):
    r = _ccddp(core_env, "selftest", "--world-size", "2", "--attacks", "flip", "--collectives", "all_reduce")
    assert r.returncode == 0 and "1 of 1 cases passed" in r.stdout, (r.stdout[-2000:], r.stderr[-2000:])


@pytest.mark.parametrize("args", [["train", "--workload", "graphsage", "--size", "tiny", "--steps", "1"],
                                  ["characterize", "--quick", "--out", "{tmp}"]])
def test_a_command_that_needs_the_bench_extra_says_so_in_one_line(core_env, tmp_path, args):
    r = _ccddp(core_env, *[a.format(tmp=tmp_path / "out") for a in args])
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("ccddp: error:")]
    assert len(errors) == 1 and "pip install 'ccddp[bench]'" in errors[0], r.stderr
