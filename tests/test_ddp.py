"""Confidential DDP on real gloo ranks: same parameters as plain DDP, no plaintext
collective during a CC-on step, the paper's operation counts, and a tampered gradient
frame stops every rank."""

from __future__ import annotations

import pytest
import torch

# Processes: the ranks seed torch per rank and one case traps torch.distributed's functions.
from dist_util import RankFailure, run_ranks

SECRET = bytes.fromhex("3b2b4a9a7edf58cac79c6fe8280fdbd6bf1437c45f5d97ac8d6c805a33021265")
FAMILIES = ["graphsage", "resnet50", "bert-base", "gpt2-large"]


def _train(rank, n, workload, cc, steps=2, transport_factory=None, forbid_plain=False, sync_transport_factory=None):
    import torch.distributed as dist

    from ccddp.comm import CommSettings
    from ccddp.crypto import GroupSecret
    from ccddp.bench.ddp import SecureDDP
    from ccddp.workloads import get_workload

    wl = get_workload(workload, size="tiny", batch_size=2, seed=1)
    torch.manual_seed(1234 + rank)  # different initial weights per rank: the init broadcast must fix that
    module = wl.build_model(device="cpu")
    with torch.no_grad():
        for p in module.parameters():
            p.add_(rank * 0.01)
    # CC-off: gloo's own collectives on the default group, no ccddp settings.
    settings = CommSettings(impl="secure", segment_bytes=4096, timeout_s=15) if cc == "on" else None
    model = SecureDDP(module, cc=cc, settings=settings, secret=GroupSecret(SECRET) if cc == "on" else None)
    if transport_factory is not None:
        g = model.hook_state.group
        g.transport = transport_factory(g)
    if sync_transport_factory is not None:
        model.secure_group.transport = sync_transport_factory(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    calls, per_step = [], []
    if forbid_plain:
        forbidden = ["all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                     "reduce_scatter_tensor", "all_to_all", "gather", "scatter", "reduce", "all_gather_object",
                     "broadcast_object_list", "_broadcast_coalesced", "barrier", "send", "recv"]
        saved = {name: getattr(dist, name) for name in forbidden if hasattr(dist, name)}

        def trap(name):
            real = saved[name]

            def f(*a, **k):
                # Anything on the ccddp group (the hook's all-reduce, DDP's own buffer sync
                # through _broadcast_coalesced(process_group, ...)) is a sealed collective.
                pg = a[0] if name == "_broadcast_coalesced" and a else k.get("group")
                if pg is not None and dist.get_backend(pg) == "ccddp":
                    return real(*a, **k)
                calls.append(name)
                raise AssertionError(f"plaintext torch.distributed.{name} during a CC-on step")
            return f

        for name in saved:
            setattr(dist, name, trap(name))
    before = model.counters()["gradients"]
    buckets_before = model.hook_state.buckets
    try:
        for step in range(steps):
            pg_before = dict(getattr(model.process_group, "calls", {}))
            loss = wl.loss(model, wl.make_batch(step, rank, n))
            try:
                loss.backward()
            except RuntimeError:
                if model.comm_failure() is not None:
                    raise model.comm_failure() from None
                raise
            opt.step()
            opt.zero_grad()
            pg_after = getattr(model.process_group, "calls", {})
            per_step.append({k: v - pg_before.get(k, 0) for k, v in pg_after.items()})
    finally:
        if forbid_plain:
            for name, f in saved.items():
                setattr(dist, name, f)
    after = model.counters()["gradients"]
    params = torch.cat([p.detach().float().view(-1) for p in model.module.parameters()])
    result = {"params": params, "calls": calls, "per_step": per_step, "pg": type(model.process_group).__name__,
              "seals": after["seals"] - before["seals"],
              "opens": after["opens"] - before["opens"], "allreduces": model.hook_state.buckets - buckets_before}
    model.close()
    return result


def _train_off_then_on(rank, n, workloads):
    return {w: (_train(rank, n, w, "off"), _train(rank, n, w, "on")) for w in workloads}


def test_cc_on_equals_cc_off_at_world_size_2():
    res = run_ranks(_train_off_then_on, 2, FAMILIES, timeout=300)
    for w in FAMILIES:
        off, on = res[0][w]
        # Two ranks: a+b is exact in either order and both hooks divide first, so bit-identical.
        assert torch.equal(on["params"], off["params"]), w
        assert torch.equal(on["params"], res[1][w][1]["params"]), w


def test_cc_on_equals_cc_off_at_world_size_3():
    res = run_ranks(_train_off_then_on, 3, FAMILIES, timeout=300)
    for w in FAMILIES:
        off, on = res[0][w]
        assert torch.allclose(on["params"], off["params"], rtol=1e-5, atol=1e-6), w
        assert torch.equal(on["params"], res[2][w][1]["params"]), "ranks must end identical"


def test_no_plaintext_collective_during_a_cc_on_step_and_counts():
    n = 3
    res = run_ranks(_train, n, "resnet50", "on", 3, None, True)
    for r in res:
        assert r["calls"] == []
        # DDP's own collectives (run from C++, out of reach of the trap) go through the
        # ccddp group: buffers before every forward, and in iteration 1 also rank 0's
        # rebuilt bucket layout, which DDP on gloo would broadcast in the clear.
        assert r["pg"] == "ProcessGroupCCDDP"
        b = [s.get("broadcast", 0) for s in r["per_step"]]
        assert b[0] >= 1 and b[1] > b[0] and b[2] == b[0], b
        # Seals per rank = 2(n-1) per all-reduce call (descriptors are counted apart).
        assert r["allreduces"] >= 2
        assert r["seals"] == 2 * (n - 1) * r["allreduces"]
        assert r["opens"] == 2 * (n - 1) * r["allreduces"]


class _Tamper:
    """Flips one bit of the ``nth`` frame this rank sends on ``group`` (counting only
    frames sent while ``during()`` holds)."""

    def __init__(self, group, nth=3, during=lambda: True):
        self.inner = group.transport
        self.nth = nth
        self.during = during
        self.sent = 0

    def isend(self, frame, dst, tag=0):
        if not self.during():
            return self.inner.isend(frame, dst, tag)
        self.sent += 1
        if self.sent == self.nth:
            frame = frame.clone()
            frame[frame.numel() // 2] ^= 1
        return self.inner.isend(frame, dst, tag)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _tamper_factory(group):
    return _Tamper(group) if group.rank == 1 else group.transport


def _train_tampered(rank, n):
    return _train(rank, n, "bert-base", "on", 3, _tamper_factory)


def test_tampered_gradient_frame_stops_every_rank():
    res = run_ranks(_train_tampered, 2, timeout=120, pg_timeout=20, return_failures=True)
    assert all(isinstance(r, RankFailure) for r in res), res
    # Rank 0 received the flipped frame: an integrity error naming the link.
    assert res[0].type_name == "IntegrityError" and "1->0" in res[0].message, res[0]


def _layout_tamper_factory(model):
    # After construction, graphsage (no buffers) broadcasts nothing until iteration 1
    # rebuilds DDP's buckets: rank 0's broadcast frames 1 and 2 are the descriptor and
    # the data of the bucket-layout broadcast.
    group = model.secure_group
    if group.rank != 0:
        return group.transport
    return _Tamper(group, nth=2, during=lambda: model.process_group.current_op == "broadcast")


def _train_layout_tampered(rank, n):
    return _train(rank, n, "graphsage", "on", 3, None, False, _layout_tamper_factory)


def test_tampered_bucket_layout_frame_stops_every_rank():
    res = run_ranks(_train_layout_tampered, 2, timeout=120, pg_timeout=20, return_failures=True)
    assert all(isinstance(r, RankFailure) for r in res), res
    # DDP's own layout broadcast is sealed: rank 1 fails its tag in forward of iteration 1.
    assert res[1].type_name == "IntegrityError" and "0->1" in res[1].message and "broadcast" in res[1].message, res[1]
