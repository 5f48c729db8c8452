"""The product installs with its core dependencies alone (torch, cryptography, numpy, and
rich and psutil for the self-test's tables and stopping a launch): the backend, DDP on it,
``ccddp launch``, ``ccddp selftest`` and ``ccddp simulate`` run in interpreters where the
``bench`` extra's packages cannot be imported, and a command that needs the extra says so
in one line (exit 2, no traceback). Each check runs in fresh interpreters (a launch's
ranks too) whose ``sitecustomize`` makes those imports fail as if nothing were installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The bench extra: measuring, modelling and reporting only.
BENCH_ONLY = ("transformers", "torch_geometric", "matplotlib", "scipy")
SECRET = "7f3c9e21d84ab65f0e12c7d93a5b8e4f61d0c2b79a3e85f4c1b6d2079e8a3f5c"

BLOCKER = f"""
import importlib.abc, sys

class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {BENCH_ONLY!r}:
            # What Python raises for a package that is not installed.
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the packaging test)", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""


def _env(tmp_path: Path) -> dict:
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ, CCDDP_GROUP_SECRET=SECRET, OMP_NUM_THREADS="1")
    env.pop("CCDDP_GROUP_SECRET_FILE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


def _run(argv: list[str], tmp_path: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=_env(tmp_path), capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


def test_the_blocker_blocks(tmp_path):
    done = _run([sys.executable, "-c", "import matplotlib"], tmp_path)
    assert done.returncode != 0 and "blocked by the packaging test" in done.stderr


BACKEND = """
import sys
import torch
import torch.distributed as dist
import ccddp, ccddp.backend
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("ccddp", rank=0, world_size=1, store=dist.HashStore())
t = torch.arange(4, dtype=torch.float32)
dist.all_reduce(t)
assert t.tolist() == [0.0, 1.0, 2.0, 3.0], t
model = DistributedDataParallel(torch.nn.Linear(4, 2))   # plain DDP on the backend
model(torch.ones(3, 4)).sum().backward()
dist.destroy_process_group()
print("OK", dist.Backend.backend_list.count("ccddp"),
      [m for m in sys.modules if m.partition(".")[0] in {blocked!r}])
"""


def test_the_backend_and_ddp_need_only_the_core_dependencies(tmp_path):
    done = _run([sys.executable, "-c", BACKEND.format(blocked=BENCH_ONLY)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[-2] == "OK 1 []", done.stdout + done.stderr[-3000:]


def test_launch_needs_only_the_core_dependencies(tmp_path):
    done = _run([sys.executable, "-m", "ccddp.cli", "launch", "--help"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--nproc-per-node" in done.stdout

    (tmp_path / "script.py").write_text(textwrap.dedent("""
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.ones(3)
        dist.all_reduce(t)
        print("BACKEND", dist.get_backend(), t.tolist())
        dist.destroy_process_group()
    """))
    done = _run([sys.executable, "-m", "ccddp.cli", "launch", "--nproc-per-node", "1", "script.py"], tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "BACKEND ccddp [1.0, 1.0, 1.0]" in done.stdout, done.stdout + done.stderr[-3000:]


def test_stopping_a_launch_needs_no_psutil(tmp_path, monkeypatch):
    # An interrupted launch ends torchrun and every rank; without psutil (the core
    # install) the ranks are found through /proc.
    from ccddp.bench import launch

    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here")
    monkeypatch.setitem(sys.modules, "psutil", None)
    child = "import subprocess, sys, time; subprocess.Popen(['sleep', '60'], start_new_session=True); " \
            "print('started', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", child], start_new_session=True, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "started"
        ranks = launch._Ranks.of(proc.pid)
        assert ranks.psutil is None and len(ranks.procs) == 1
        launch.stop(proc, grace_s=2.0)
        assert proc.poll() is not None
        assert not any(launch._proc_running(p) for p in ranks.procs)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_core_dependencies_are_torch_cryptography_numpy_and_the_self_tests_tables():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in project["dependencies"]}
    # rich and psutil: `ccddp selftest` (the cluster's security check) and `simulate` run on
    # the core install (test_selftest_and_simulate_need_only_the_core_dependencies).
    assert names == {"torch", "cryptography", "numpy", "rich", "psutil"}
    extras = project["optional-dependencies"]
    for name in BENCH_ONLY:
        assert any(d.startswith(name) for d in extras["bench"]), name
    assert "ccddp[bench]" in extras["test"]
    assert sum(d.startswith("scipy") for d in extras["bench"]) == 1


def test_selftest_and_simulate_need_only_the_core_dependencies(tmp_path):
    done = _run([sys.executable, "-m", "ccddp.cli", "simulate", "--workload", "bert-base", "--gpus", "8"], tmp_path)
    assert done.returncode == 0 and "bert-base" in done.stdout, done.stderr[-3000:]
    done = _run([sys.executable, "-m", "ccddp.cli", "selftest", "--world-size", "2", "--attacks", "flip",
                 "--collectives", "all_reduce"], tmp_path)
    assert done.returncode == 0 and "1 of 1 cases passed" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]


@pytest.mark.parametrize("args", [["train", "--workload", "graphsage", "--size", "tiny", "--steps", "1"],
                                  ["characterize", "--quick", "--out", "out"]])
def test_a_command_that_needs_the_bench_extra_says_so_in_one_line(tmp_path, args):
    done = _run([sys.executable, "-m", "ccddp.cli", *args], tmp_path)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("ccddp: error:")]
    assert len(errors) == 1 and "pip install 'ccddp[bench]'" in errors[0], done.stderr
