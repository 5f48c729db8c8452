"""A mistake on the command line is answered before torch or a model loads: the four a new
user meets first each exit 2 with one line ``ccddp: error: ...`` in a fresh interpreter
that never imported torch (checked in ``sys.modules``, not with a clock)."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys

import pytest

from ccddp.cli.cmd_bench import NO_CUDA_DEVICE
from ccddp.cli.preflight import gpu_device_files

PROBE = """
import json, sys
from ccddp.cli import main
code = main(json.loads(sys.argv[1]))
print("TORCH" if "torch" in sys.modules else "NO-TORCH", code)
"""

MISTAKES = [
    ["train", "--workload", "bert-tiny"],
    ["train", "--workload", "bert-base", "--world-size", "1", "--cc", "on"],
    ["bench", "collectives", "--world-size", "1"],
    ["characterize", "--world-sizes", "1", "--out", "OUT"],
]


@pytest.mark.parametrize("argv", MISTAKES, ids=lambda a: " ".join(a[:3]))
def test_a_mistake_is_refused_before_torch_loads(argv, tmp_path):
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    p = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert p.stdout.split() == ["NO-TORCH", "2"], p.stdout + p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ccddp: error: "), p.stderr
    assert not (tmp_path / "out").exists()


def test_the_static_names_match_the_registries():
    from ccddp.bench.options import IMPL_NAMES, WORKLOAD_LIBRARY, WORKLOAD_NAMES
    from ccddp.bench.reference import IMPLS
    from ccddp.workloads import WORKLOADS

    assert list(WORKLOAD_NAMES) == list(WORKLOADS)
    assert tuple(IMPL_NAMES) == tuple(IMPLS)
    for name, cls in WORKLOADS.items():      # the library a launch checks for is the one its model needs
        source = inspect.getsource(cls._create_model)    # an import, or PyG's loader (workloads/pyg.py)
        assert re.search(rf'(from |pyg\.load\("){WORKLOAD_LIBRARY[name]}\b', source), name


@pytest.mark.parametrize("argv", [
    ["train", "--workload", "graphsage", "--dtype", "float64"],
    ["train", "--workload", "graphsage", "--batch-size", "0"],
    ["train", "--workload", "graphsage", "--nnodes", "2", "--node-rank", "2", "--master-port", "29500"],
    ["bench", "collectives", "--impl", "gloo,nccl"],
    ["bench", "collectives", "--sizes", "1M,x"],
    ["characterize", "--workloads", "bert", "--out", "OUT"],
    ["bench", "channel", "--device", "cuda", "--size", "1Q"],
])
def test_other_argument_errors_are_refused_before_torch_loads(argv, tmp_path):
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    p = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert p.stdout.split() == ["NO-TORCH", "2"], p.stdout + p.stderr
    assert p.stderr.startswith("ccddp: error: ") and p.stderr.count("\n") == 1, p.stderr


#: ``ccddp train``'s parent up to the launch: torchrun replaced by a report of what the
#: parent had loaded by then.
LAUNCH_PROBE = """
import json, sys
import ccddp.bench.launch as launch
def torchrun(*args, **kwargs):
    print("TORCH" if "torch" in sys.modules else "NO-TORCH", flush=True)
    raise SystemExit(0)
launch.torchrun = torchrun
from ccddp.cli import main
main(json.loads(sys.argv[1]))
"""


def test_a_tiny_train_launches_its_ranks_without_loading_torch(tmp_path):
    """A tiny model needs no memory check (its size is fixed and small: ``test_cli_train``),
    so the parent starts torchrun without loading torch or the model's library (3-5 s
    sooner: the ranks load them anyway)."""
    argv = ["train", "--workload", "graphsage", "--size", "tiny", "--cc", "off,on", "--steps", "6"]
    p = subprocess.run([sys.executable, "-c", LAUNCH_PROBE, json.dumps(argv)], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path, env={**os.environ, "CCDDP_GROUP_SECRET": ""})
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("ccddp train: graphsage (tiny) on 2 ranks"), lines
    assert not any("fits in memory" in line for line in lines), lines
    assert lines[-1] == "NO-TORCH", p.stdout + p.stderr


@pytest.mark.skipif(bool(gpu_device_files()), reason="this machine has a GPU device: torch answers there")
def test_bench_channel_on_cuda_without_a_gpu_device_says_so_without_torch(tmp_path):
    """The GPU check runs it once per size: on a machine with no GPU device file the answer
    needs no torch."""
    p = subprocess.run([sys.executable, "-c", PROBE, json.dumps(["bench", "channel", "--device", "cuda"])],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.stdout.splitlines() == [NO_CUDA_DEVICE, "NO-TORCH 0"], p.stdout + p.stderr
