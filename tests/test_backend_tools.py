"""PyTorch's distributed tools on the ccddp backend, each against gloo: the same results
(two ranks: bit-identical, as a+b is exact in either order) and not one marker of model
data in what the processes wrote to their sockets -- while gloo's socket bytes show the
markers of every tool (so the search would see a leak).

One torchrun launch per backend runs every tool (tests/backend_tools_main.py): DDP with
no_sync, find_unused_parameters, gradient_as_bucket_view, static_graph, bf16 autocast, a
checkpoint and DistributedSampler; Join with uneven inputs; ZeroRedundancyOptimizer
(plain, and overlap_with_ddp, which torch refuses on gloo: compared with the same SGD
updates); torch.compile(ddp_model); the fp16 and PowerSGD comm hooks; fully_shard; the
object collectives.
"""

from __future__ import annotations

import pytest
import torch

from wire_util import build_wiretap, found, torchrun, wire_bytes

SCRIPT = "tests/backend_tools_main.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tools")
    lib = build_wiretap(tmp)
    out = {}
    for backend in ("gloo", "ccddp"):
        d = tmp / backend
        (d / "wire").mkdir(parents=True)
        proc = torchrun([SCRIPT, backend, str(d)], wiretap=lib, wire_dir=d / "wire", timeout=900)
        assert proc.returncode == 0, proc.stderr[-4000:]
        ranks = [torch.load(d / f"rank{r}.pt") for r in range(2)]
        out[backend] = {"ranks": ranks, "wire": wire_bytes(d / "wire")}
    return out


def test_every_tool_matches_gloo(runs):
    gloo, ccddp = runs["gloo"]["ranks"], runs["ccddp"]["ranks"]
    assert set(gloo[0]["results"]) == set(ccddp[0]["results"])
    for rank in range(2):
        for check, expected in gloo[rank]["results"].items():
            got = ccddp[rank]["results"][check]
            assert torch.equal(got, expected), (rank, check, (got - expected).abs().max())
    for check in ccddp[0]["results"]:
        if check != "sampler":
            assert torch.equal(ccddp[0]["results"][check], ccddp[1]["results"][check]), check


def test_no_model_data_on_any_socket(runs):
    # The markers: 16-byte windows of rank 0's initial parameters, of every all-reduced
    # gradient (and its fp16 form), of parameters after ZeRO steps and of FSDP's full
    # parameters, and the text of an all_gather_object payload -- from both runs.
    checks = set(runs["gloo"]["ranks"][0]["markers"])
    assert checks >= {"ddp_unused_views", "ddp_static_graph", "checkpoint", "join", "zero", "zero_overlap",
                      "compile", "hook_fp16", "hook_powersgd", "fsdp", "objects"}
    leaks = {}
    for check in checks:
        markers = [m for run in runs.values() for rank in run["ranks"] for m in rank["markers"].get(check, [])]
        assert len(markers) >= 2, check
        if check != "zero_overlap":  # torch refuses to run it on gloo
            assert found(markers, runs["gloo"]["wire"]), f"{check}: no marker in gloo's bytes: the search is blind"
        leaked = found(markers, runs["ccddp"]["wire"])
        if leaked:
            leaks[check] = len(leaked)
    assert not leaks, f"model data in plaintext on a socket under ccddp: {leaks}"
    assert len(runs["ccddp"]["wire"]) > 100_000  # the recorder saw the sealed traffic
