"""Device tensors through the ccddp backend: the placement choice, the staging through host
memory, device frames crossing through host buffers, NCCL served by ccddp, and (on a GPU)
the collectives on CUDA tensors with both placements.

On this project's CI there is no GPU: the CUDA variants are collected and skipped with
their reason; everything the device path does that is not CUDA -- staging copies, frames
through host buffers, the Triton engine on the data path -- runs on CPU tensors here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from ccddp.backend.placement import Placement, PlacementRates, choose, rates_from_profile, stage_in, stage_out
from ccddp.errors import ConfigError
from dist_util import child_env
from wire_util import HERE, SRC, build_wiretap, found, json_rows, torchrun, wire_bytes

SCRIPT = str(HERE / "device_paths_main.py")
CUDA = torch.device("cuda:0")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: the CUDA path is run by the GPU check")


# -- the placement choice ---------------------------------------------------------------------
def test_placement_follows_the_setting_then_the_profile_then_triton():
    fast_device = PlacementRates(device_s_per_byte=1e-11, staged_s_per_byte=1e-10)
    fast_staged = PlacementRates(device_s_per_byte=1e-10, staged_s_per_byte=1e-11)
    assert choose("staged", CUDA, triton=True, rates=fast_device) is Placement.STAGED
    assert choose("device", CUDA, triton=True, rates=fast_staged) is Placement.DEVICE
    assert choose("auto", CUDA, triton=True, rates=None) is Placement.DEVICE
    assert choose("auto", CUDA, triton=True, rates=fast_staged) is Placement.STAGED
    assert choose("auto", CUDA, triton=True, rates=fast_device) is Placement.DEVICE
    assert choose("auto", CUDA, triton=False, rates=fast_device) is Placement.STAGED
    with pytest.raises(ConfigError, match="Triton"):
        choose("device", CUDA, triton=False, rates=None)
    with pytest.raises(ValueError):
        choose("auto", torch.device("cpu"), triton=True, rates=None)


def _profile(path, source="measured", **rates) -> str:
    fields = {"enc_gbps": 80.0, "dec_gbps": 80.0, "cpu_crypto_gbps": 5.0, "staging_d2h_gbps": 20.0,
              "staging_h2d_gbps": 20.0, **rates}
    crypto = "\n".join(f'{k} = {{ value = {v}, source = "{source}" }}' for k, v in fields.items()
                       if not k.startswith("staging"))
    staging = "\n".join(f'{k} = {{ value = {v}, source = "{source}" }}' for k, v in fields.items()
                        if k.startswith("staging"))
    path.write_text(f"[profile]\nname = \"gpu\"\n[crypto]\n{crypto}\n[staging]\n{staging}\n")
    return str(path)


def test_rates_come_from_a_calibrated_profile(tmp_path, monkeypatch):
    rates = rates_from_profile(_profile(tmp_path / "p.toml"))
    assert rates is not None and rates.faster() is Placement.DEVICE
    assert rates.device_s_per_byte == pytest.approx(2 / 80e9)
    assert rates.staged_s_per_byte == pytest.approx(2 / 20e9 + 2 / 5e9)
    slow_engine = rates_from_profile(_profile(tmp_path / "q.toml", enc_gbps=0.5, dec_gbps=0.5))
    assert slow_engine.faster() is Placement.STAGED
    assert rates_from_profile(_profile(tmp_path / "r.toml", source="assumed")) is None, "assumed rates decide nothing"
    monkeypatch.setenv("CCDDP_PROFILE", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="CCDDP_PROFILE"):
        rates_from_profile()
    monkeypatch.delenv("CCDDP_PROFILE")
    assert rates_from_profile() is None


def test_staging_works_in_a_copy_and_writes_it_back():
    t = torch.arange(12.0).reshape(3, 4).t()          # not contiguous
    host, back = stage_out(t)
    assert host.is_contiguous() and torch.equal(host, t) and host.data_ptr() != t.data_ptr()
    host.mul_(2)
    assert torch.equal(t, torch.arange(12.0).reshape(3, 4).t()), "nothing written before the op completes"
    back()
    assert torch.equal(t, torch.arange(12.0).reshape(3, 4).t() * 2)
    x = torch.ones(5)
    copy = stage_in(x)
    copy.add_(1)
    assert torch.equal(x, torch.ones(5))


# -- runs -------------------------------------------------------------------------------------
def _launch(*args: str, nproc: int = 2, launcher: str = "torchrun", tmp_path=None, env: dict | None = None,
            wire: bool = False):
    extra = dict(env or {})
    if launcher == "ccddp":
        full = child_env(dict(OMP_NUM_THREADS="1", **{
            "CCDDP_GROUP_SECRET": "9c41d0e2b7f35a86c1e4d92b07a3f6185de0c4b2a97f3e6d5c8b1a0f2e4d6c83", **extra}))
        done = subprocess.run([sys.executable, "-m", "ccddp.cli", "launch", "--nproc-per-node", str(nproc), SCRIPT,
                               *args], env=full, capture_output=True, text=True, timeout=600)
    else:
        lib = build_wiretap(tmp_path) if wire else None
        if wire:
            (tmp_path / "wire").mkdir()
        done = torchrun([SCRIPT, *args], nproc=nproc, wiretap=lib, wire_dir=tmp_path / "wire" if wire else None,
                        env=extra)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json_rows(done.stdout)
    assert sorted(r["rank"] for r in rows) == list(range(nproc)), done.stdout
    return rows


def _all_passed(rows) -> None:
    for r in rows:
        assert r["checks"] and all(r["checks"].values()), r


@pytest.mark.parametrize("engine", ["auto", pytest.param("triton", marks=pytest.mark.skipif(
    torch.cuda.is_available(), reason="on a GPU machine the ranks compile Triton for the GPU: CPU tensors need "
                                      "its interpreter (the GPU variants below run the engine there)"))])
def test_frames_through_host_buffers_give_gloos_results_and_no_plaintext(engine, tmp_path):
    """The transport of device frames (ciphertext copied to a host buffer to be sent, and
    from the host buffer it lands in to the frame when its wait returns), run on CPU
    frames of three ranks, sealed by OpenSSL or by the device engine (Triton, interpreted
    on CPU tensors): every collective, point-to-point message and DDP step gives gloo's
    results, every frame crossed through a host buffer, and no model byte is on the wire."""
    rows = _launch("--host-frames", "--marker", "--engine", engine, "--numel", "301", nproc=3, tmp_path=tmp_path,
                   wire=True)
    _all_passed(rows)
    assert {r["backend"] for r in rows} == {"ccddp"}
    assert all(r["staged_frames"] > 10 for r in rows), rows
    marker = torch.tensor([1234.5678], dtype=torch.float32).numpy().tobytes()
    markers = [marker * 4, (torch.tensor([1235.5678], dtype=torch.float32).numpy().tobytes()) * 4]
    wire = wire_bytes(tmp_path / "wire")
    assert len(wire) > 3 * 301 * 4, "the wiretap recorded the run"
    assert not found(markers, wire)


def test_copies_to_host_still_running_are_sent_before_a_rank_blocks():
    """Device frames for gloo are copied to host behind their seal and sent when the copy
    is done. Here no copy says it is done until it is waited for (a GPU copy still queued):
    every op and DDP step still completes with the reference results on three ranks -- the
    pipeline waits for its pending copies and sends them before it blocks on a peer."""
    rows = _launch("--host-frames", "--late-copies", "--numel", "6145", nproc=3)
    _all_passed(rows)
    assert all(r["late_copies"] > 20 for r in rows), rows


def test_the_wiretap_sees_gloos_plaintext(tmp_path):
    """The control for the test above: the same script on gloo puts the markers on the wire."""
    rows = _launch("--backend", "gloo", "--marker", "--numel", "512", tmp_path=tmp_path, wire=True)
    assert {r["backend"] for r in rows} == {"gloo"}
    marker = torch.tensor([1234.5678], dtype=torch.float32).numpy().tobytes() * 4
    assert found([marker], wire_bytes(tmp_path / "wire"))


def test_ccddp_launch_serves_a_script_that_asks_for_nccl():
    rows = _launch("--backend", "nccl", launcher="ccddp")
    _all_passed(rows)
    assert {r["backend"] for r in rows} == {"ccddp"}


# -- on a GPU ---------------------------------------------------------------------------------
@needs_gpu
@pytest.mark.parametrize("placement", ["device", "staged"])
def test_cuda_tensors_on_two_ranks_sharing_one_gpu(placement, tmp_path):
    """Two ranks on the one GPU of a lent machine (NCCL would refuse them): every op and a
    DDP step on CUDA tensors give the local reference's results, and, where a C compiler
    can build the wiretap, no model byte is on the wire."""
    wire = shutil.which(os.environ.get("CC", "cc")) is not None
    rows = _launch("--device", "cuda", "--placement", placement, "--marker", "--numel", "4096", tmp_path=tmp_path,
                   wire=wire)
    _all_passed(rows)
    assert all(r["device"].startswith("cuda") for r in rows)
    if wire:
        marker = torch.tensor([1234.5678], dtype=torch.float32).numpy().tobytes() * 4
        recorded = wire_bytes(tmp_path / "wire")
        assert len(recorded) > 2 * 4096 * 4, "the wiretap recorded the run"
        assert not found([marker], recorded)


@needs_gpu
def test_a_cuda_script_asking_for_nccl_runs_sealed_under_ccddp_launch():
    rows = _launch("--device", "cuda", "--backend", "nccl", launcher="ccddp")
    _all_passed(rows)
    assert {r["backend"] for r in rows} == {"ccddp"}
