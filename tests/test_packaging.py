"""The product installs with its core dependencies alone (torch, cryptography, numpy):
the backend, DDP on it and ``ccddp launch`` run in interpreters where the ``bench``
extra's packages cannot be imported. Each check runs in fresh interpreters (a launch's
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
BENCH_ONLY = ("transformers", "torch_geometric", "matplotlib", "rich", "scipy", "psutil")
SECRET = "7f3c9e21d84ab65f0e12c7d93a5b8e4f61d0c2b79a3e85f4c1b6d2079e8a3f5c"

BLOCKER = f"""
import importlib.abc, sys

class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {BENCH_ONLY!r}:
            raise ImportError(f"{{name}} is not installed (blocked by the packaging test)")
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
    done = _run([sys.executable, "-c", "import rich"], tmp_path)
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


def test_the_core_dependencies_are_torch_cryptography_and_numpy():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in project["dependencies"]}
    assert names == {"torch", "cryptography", "numpy"}
    extras = project["optional-dependencies"]
    for name in BENCH_ONLY:
        assert any(d.startswith(name) for d in extras["bench"]), name
    assert "ccddp[bench]" in extras["test"]
    assert sum(d.startswith("scipy") for d in extras["bench"]) == 1
