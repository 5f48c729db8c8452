"""A representative slice of PyTorch's own backend suite (torch.testing._internal.
distributed.distributed_test, as scripts/torch_conformance.sh runs in full) on the ccddp
backend at world size 2: the collectives, point to point, barriers, object collectives
and DDP. The full comparison with gloo is scripts/torch_conformance.sh. Here the ranks
are forked from a fork server that imported the suite once (``CONFORMANCE_START=
forkserver``): the same tests, a fifth of the CPU of spawning every rank."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from wire_util import HERE, SECRET_HEX, SRC

NAMES = ["test_all_reduce_sum", "test_broadcast", "test_all_gather", "test_gather", "test_send_recv",
         "test_barrier", "test_DistributedDataParallelCPU"]
SUBSET = " or ".join(f"({name} and not {name}_)" for name in NAMES)


@pytest.mark.timeout(1500)
def test_pytorch_backend_suite_subset(tmp_path):
    xml = tmp_path / "ccddp.xml"
    env = dict(os.environ, BACKEND="ccddp", CONFORMANCE_START="forkserver", WORLD_SIZE="2", TEMP_DIR=str(tmp_path), CCDDP_GROUP_SECRET=SECRET_HEX,
               CCDDP_SETTINGS='{"timeout_s": 120}', PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "pytest", str(HERE.parent / "scripts" / "torch_conformance.py"),
                           "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-k", SUBSET, "--junitxml", str(xml)],
                          env=env, capture_output=True, text=True, timeout=1500, cwd=tmp_path)
    cases = list(ET.parse(xml).getroot().iter("testcase"))
    failed = [c.get("name") for c in cases if any(ch.tag in ("failure", "error") for ch in c)]
    passed = [c.get("name") for c in cases if not any(ch.tag in ("failure", "error", "skipped") for ch in c)]
    assert not failed, proc.stdout[-4000:]
    assert sorted(passed) == sorted(NAMES), (sorted(set(NAMES) - set(passed)), proc.stdout[-2000:])
