"""``ccddp train`` across two machines (issue 43): network-namespace hosts hostA and hostB,
each running one node of the job, reaching each other only through hostH's forwarder.
``--master-addr`` names node 0's address; without it the README's multi-node command
could not work across real machines (the launch hard-coded 127.0.0.1)."""

from __future__ import annotations

import json
import os
import sys

import pytest

import netns_util as nu


@pytest.mark.multiprocess
def test_train_runs_across_two_hosts_with_master_addr(tmp_path):
    secret = os.urandom(32).hex()
    common = ["-m", "ccddp.cli", "train", "--workload", "graphsage", "--size", "tiny", "--cc", "off,on",
              "--steps", "2", "--warmup", "1", "--world-size", "1", "--nnodes", "2",
              "--master-addr", nu.A_IP, "--master-port", "29533", "--timeout", "60"]
    out = tmp_path / "train.json"
    with nu.hosts() as h, h.wire(tmp_path / "wire.bin"):
        env = nu.child_env(CCDDP_GROUP_SECRET=secret)
        node0 = h.popen("A", [sys.executable, *common, "--node-rank", "0", "--json", str(out)], env=env)
        node1 = h.popen("B", [sys.executable, *common, "--node-rank", "1"], env=env)
        done = [p.communicate(timeout=420) for p in (node0, node1)]
    for p, (stdout, stderr) in zip((node0, node1), done):
        assert p.returncode == 0, (stdout[-2000:], stderr[-3000:])
    runs = json.loads(out.read_text())["runs"]
    assert {r["variant"] for r in runs} >= {"off", "on:pipelined"}, [r["variant"] for r in runs]
    assert all(r["world_size"] == 2 for r in runs)
    on = next(r for r in runs if r["variant"].startswith("on"))
    assert on["seals_per_rank"] > 0          # the gradients crossed between the hosts sealed
