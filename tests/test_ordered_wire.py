"""Device frames on an ordered wire (NCCL): the step-grouped schedule, the choice of wire,
bounded waits, and ranks that disagree on the wire.

NCCL needs a GPU per rank, and the lent GPU machines have one GPU: the pipelined
collectives run here on an emulation of NCCL's matching and ordering over gloo
(``ccddp.testing.serial_wire``), which is shown to deadlock where NCCL would; on a GPU, the
NCCL wire's own calls run on one rank, and two ranks on two GPUs run when there are two.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from ccddp.backend.links import choose_device_wire, gpu_report
from ccddp.comm.ordered import OrderedWire
from ccddp.errors import ConfigError, FrameLabel, PeerTimeoutError
from wire_util import HERE, build_wiretap, found, json_rows, torchrun, wire_bytes

SECRET = "9c41d0e2b7f35a86c1e4d92b07a3f6185de0c4b2a97f3e6d5c8b1a0f2e4d6c83"
PATHS = str(HERE / "device_paths_main.py")
PROBE = str(HERE / "ordered_probe_main.py")


def _run(script: str, *args: str, nproc: int, tmp_path=None, wire: bool = False) -> list[dict]:
    lib = build_wiretap(tmp_path) if wire else None
    if wire:
        (tmp_path / "wire").mkdir()
    done = torchrun([script, *args], nproc=nproc, wiretap=lib, wire_dir=tmp_path / "wire" if wire else None,
                    env={"CCDDP_GROUP_SECRET": SECRET})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json_rows(done.stdout)
    assert sorted({r["rank"] for r in rows}) == list(range(nproc)), done.stdout
    return rows


# -- the schedule ---------------------------------------------------------------------------
def test_pipelined_collectives_on_an_ordered_wire_give_the_reference_results(tmp_path):
    """Every rank's frames are device frames (forced on CPU) and the group's ordered wire
    keeps NCCL's rules (tags ignored, one group at a time): all-reduce (SUM, MAX, strided),
    chain broadcast from the last rank, all-gather, reduce-scatter and DDP steps give the
    reference results over 3 ranks (the broadcast's chain: a root, a rank that forwards and
    a last one), with chunks of uneven segment counts (6145 elements in 1024-element
    segments), and no model byte is on the wire."""
    nproc = 3
    rows = _run(PATHS, "--host-frames", "--ordered-wire", "--marker", "--numel", "6145", nproc=nproc,
                tmp_path=tmp_path, wire=True)
    for r in rows:
        assert r["checks"] and all(r["checks"].values()), r
        assert r["device_wire"] == "serial (emulated NCCL)"
        assert r["ordered_groups"] > 30, r              # the pipelined ops took the wire
    marker = torch.tensor([1234.5678], dtype=torch.float32).numpy().tobytes() * 4
    recorded = wire_bytes(tmp_path / "wire")
    assert len(recorded) > nproc * 6145 * 4, "the wiretap recorded the run"
    assert not found([marker], recorded)


@pytest.mark.slow
def test_attacks_on_the_ordered_wire_are_caught_at_the_attacked_frame():
    """The host flips a bit of, reorders or drops a sealed frame on link 0 -> 1 of the
    ordered wire (three ranks, a group and a wire per case): rank 1 rejects that very frame
    (step 0, segment 1 for the flip of frame 1; segment 0 for the others), the other ranks
    stop within the timeout instead of finishing with a result built on it, and the
    group's next all-reduce fails on every rank; a clean all-reduce before each attack
    gives the reference result."""
    rows = _run(str(HERE / "ordered_attack_main.py"), nproc=3)
    cases = {(r["rank"], r["attack"]): r for r in rows if "attack" in r}
    for attack, segment in (("flip", 1), ("reorder", 0), ("drop", 0)):
        for rank in range(3):
            r = cases[rank, attack]
            assert r["clean"] == "completed" and r["after"] != "completed", r
            if rank == 1:
                assert r["attacked"] == "integrity", r
                assert f"link 0->1, collective all_reduce#2, step 0, segment {segment})" in r["detail"], r
            else:
                assert r["attacked"] == "timeout" and r["seconds"] < 10, r
        assert cases[0, attack]["applied"] == 1                    # the attack was made, once


def test_the_emulation_deadlocks_where_nccl_would():
    """The emulation has NCCL's teeth: an exchange posted as one group completes; posted
    as gloo's plan (each rank's receive alone, then its send) it never does, the wait ends
    in the wire's timeout on both ranks, and the wire refuses further frames."""
    paired = _run(PROBE, "--mode", "paired", nproc=2)
    assert all(r["outcome"] == "completed" and r["ok"] for r in paired), paired
    t0 = time.monotonic()
    first = _run(PROBE, "--mode", "receive-first", "--timeout", "2", nproc=2)
    assert all(r["outcome"] == "timed out" and r["ok"] and r["refused_after"] for r in first), first
    assert all(1.9 < r["seconds"] < 10 for r in first) and time.monotonic() - t0 < 60


def test_ranks_on_different_wires_fail_at_once_saying_so():
    """Rank 0's frames on the ordered wire, rank 1's on gloo (placements that differ): both
    ranks fail the collective with a ConfigError naming both wires, within a second,
    before either posts data the other would never match."""
    rows = _run(PROBE, "--mode", "mismatch", nproc=2)
    for r in rows:
        assert "over an ordered wire (NCCL)" in r["error"] and "over gloo" in r["error"], r
        assert "same placement" in r["error"] and r["seconds"] < 5, r


# -- the wire -------------------------------------------------------------------------------
class _Never:
    def is_completed(self) -> bool:
        return False

    def wait(self) -> bool:
        raise AssertionError("a wait before completion would block without a limit")


class _Stuck(OrderedWire):
    name = "stuck"

    def __init__(self, refuse: bool = False) -> None:
        super().__init__(rank=0, timeout_s=0.2)
        self.refuse = refuse

    def _post_group(self, send, recv):
        if self.refuse:
            raise RuntimeError("NCCL error: unhandled system error\nat ProcessGroupNCCL.cpp:1")
        return _Never()


def test_a_wait_is_bounded_and_breaks_the_wire():
    wire = _Stuck()
    frame = torch.zeros(8, dtype=torch.uint8)
    work = wire.post(recv=(frame, 1))
    t0 = time.monotonic()
    with pytest.raises(PeerTimeoutError, match="rank 1") as err:
        wire.wait(work, 1, FrameLabel("1->0", "all_reduce#1", 0, 0))
    assert 0.2 <= time.monotonic() - t0 < 2
    assert err.value.label is not None
    with pytest.raises(PeerTimeoutError, match="failed earlier .*no answer from rank 1"):
        wire.post(send=(frame, 1))
    wire.fail("a later reason")
    assert wire.broken.startswith("no answer from rank 1")


def test_a_refused_post_is_typed_and_breaks_the_wire():
    wire = _Stuck(refuse=True)
    frame = torch.zeros(8, dtype=torch.uint8)
    with pytest.raises(PeerTimeoutError, match="refused a frame: NCCL error: unhandled system error"):
        wire.post(send=(frame, 1), recv=(frame, 1))
    with pytest.raises(PeerTimeoutError, match="failed earlier"):
        wire.post(send=(frame, 1))
    with pytest.raises(ValueError):
        OrderedWire(0, 1.0).post()


# -- the choice -----------------------------------------------------------------------------
GPU = [f"nccl node0 GPU-{i}".encode() for i in range(4)]


@pytest.mark.parametrize("setting", ["auto", "nccl"])
def test_nccl_where_every_rank_has_a_gpu_of_its_own(setting):
    assert choose_device_wire(setting, GPU) == "nccl"
    assert choose_device_wire(setting, [b"nccl node0 GPU-0", b"nccl node1 GPU-0"]) == "nccl"  # two hosts


def test_gloo_where_ranks_share_or_lack_a_gpu_unless_nccl_is_asked_for():
    shared = [GPU[0], GPU[1], GPU[0]]
    lacking = [GPU[0], b"no-nccl"]
    assert choose_device_wire("auto", shared) == "gloo"
    assert choose_device_wire("auto", lacking) == "gloo"
    with pytest.raises(ConfigError, match="ranks 0 and 2 share a GPU"):
        choose_device_wire("nccl", shared)
    with pytest.raises(ConfigError, match=r"ranks \[1\] have no GPU or no NCCL"):
        choose_device_wire("nccl", lacking)
    assert choose_device_wire("gloo", GPU) == "gloo"
    assert choose_device_wire("nccl", GPU[:1]) == "gloo"            # one rank: no frames at all


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA says so")
def test_a_rank_without_cuda_reports_no_nccl():
    assert gpu_report(torch.device("cuda:0")) == b"no-nccl"


# -- on a GPU -------------------------------------------------------------------------------
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: the NCCL wire is run by the GPU check")


@needs_gpu
def test_the_nccl_wire_sends_a_cuda_frame_to_itself_on_one_gpu():
    """The NCCL wire's own calls (an internal communicator, one group of a send and a
    receive, the bounded wait) on the one GPU of a lent machine: a rank sends to itself."""
    code = (
        "import torch, torch.distributed as dist\n"
        "from ccddp.comm.ordered import NcclWire\n"
        "from ccddp.errors import FrameLabel\n"
        "torch.cuda.set_device(0)\n"
        "wire = NcclWire.open(dist.HashStore(), 0, 1, 60)\n"
        "frame = torch.arange(1 << 20, device='cuda').to(torch.uint8)\n"
        "landing = torch.zeros_like(frame)\n"
        "work = wire.post(send=(frame, 0), recv=(landing, 0))\n"
        "wire.wait(work, 0, FrameLabel('0->0', 'probe'))\n"
        "assert torch.equal(frame, landing), 'the frame did not arrive'\n"
        "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs: NCCL refuses two ranks on one")
def test_cuda_device_frames_over_nccl_on_two_gpus():
    """Two ranks, a GPU each: the group chooses the NCCL wire, and every op and DDP step
    on CUDA tensors with the device placement gives the reference results."""
    rows = _run(PATHS, "--device", "cuda", "--placement", "device", "--numel", "6145", nproc=2)
    for r in rows:
        assert r["checks"] and all(r["checks"].values()), r
        assert r["device_wire"] == "NCCL", r
