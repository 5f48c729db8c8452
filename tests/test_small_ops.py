"""Issue 42, the fixed cost of a small sealed op: the two-rank exchange, the probe, the size
sweep preset and the small-op staging rule."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
import torch

# Processes: the exchange case wraps collectives._run_ring for itself and the mismatch case
# lowers EXCHANGE_MAX_BYTES on one rank (module globals, per rank).
from dist_util import run_ranks as run_process_ranks
from thread_ranks import run_thread_ranks as run_ranks

SECRET = bytes.fromhex("80a1ef968996f68127072dc1ef099048d83d39e3cbc8858a8292625323edcfc0")


def _group(impl="secure", **kw):
    from ccddp.comm import CommSettings, SecureGroup, Transport
    from ccddp.crypto import GroupSecret

    return SecureGroup(CommSettings(impl=impl, timeout_s=20, **kw), secret=GroupSecret(SECRET),
                       transport=Transport.open(None, 20))


def test_exchange_plan_sends_and_reduces_the_whole_buffer():
    from ccddp.comm.plan import exchange_plan
    from ccddp.crypto.aad import Phase

    for rank in (0, 1):
        (step,) = exchange_plan(rank, 1000)
        assert (step.send_peer, step.recv_peer) == (1 - rank, 1 - rank)
        assert step.send_region == step.recv_region == (0, 1000)
        assert step.action == "reduce" and step.phase is Phase.EXCHANGE


def _exchange_rank(rank, n):
    import torch.distributed as dist

    from ccddp.bench.reference import all_reduce
    from ccddp.comm import collectives
    from ccddp.comm.reduce import Reduction
    from ccddp.crypto.aad import Op

    out = {}
    ops = []
    real = collectives._run_ring

    def seen(g, flat, steps, op, *a, **k):
        ops.append(op)
        return real(g, flat, steps, op, *a, **k)

    collectives._run_ring = seen
    real_prepared = collectives.run_prepared
    prepared = []

    def seen_prepared(g, flat, p, reduction):
        ops.append(Op.EXCHANGE_ALL_REDUCE)
        prepared.append(p.key)
        return real_prepared(g, flat, p, reduction)

    collectives.run_prepared = seen_prepared
    for chains in (1, 2):
        g = _group(chains=chains, segment_bytes=1024)
        gen = torch.Generator().manual_seed(rank)
        for numel in (1, 7, 1000, 5000):       # 5000 floats: several segments of 1 KiB
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                for red in ("SUM", "MAX", "MIN", "PRODUCT"):
                    x = (torch.randn(numel, generator=gen) * 3).to(dtype)
                    ref = x.clone()
                    dist.all_reduce(ref, op=getattr(dist.ReduceOp, red))
                    got = all_reduce(x, g, op=getattr(Reduction, red))
                    # Every rank must hold the same bits (DDP's replicas stay equal).
                    everyone = [torch.empty_like(got) for _ in range(n)]
                    dist.all_gather(everyone, got)
                    out[(chains, numel, str(dtype), red)] = (
                        all(torch.equal(e.view(torch.uint8), got.view(torch.uint8)) for e in everyone),
                        torch.allclose(got.float(), ref.float(), rtol=1e-2, atol=1e-2))
        # Above the limit, the ring.
        big = torch.ones(collectives.EXCHANGE_MAX_BYTES // 4 + 1)
        all_reduce(big, g)
        out[(chains, "big")] = (bool((big == n).all()), True)
        g.close()
    out["ops"] = sorted({o.name for o in ops})
    out["last"] = ops[-1].name
    out["exchange"] = sum(o is Op.EXCHANGE_ALL_REDUCE for o in ops)
    out["prepared"] = len(prepared)
    return out


def test_two_rank_small_all_reduce_is_one_exchange_bit_identical_on_both_ranks():
    for res in run_process_ranks(_exchange_rank, 2, timeout=300):
        assert res.pop("ops") == ["ALL_REDUCE", "EXCHANGE_ALL_REDUCE"]
        assert res.pop("last") == "ALL_REDUCE"            # the buffer above the limit
        assert res.pop("exchange") == 2 * 4 * 3 * 4
        # What fits one 1 KiB segment (1 and 7 elements) takes the prepared op; 1000 and 5000
        # elements are several segments, which the pipeline runs.
        assert res.pop("prepared") == 2 * 2 * 3 * 4
        for key, (same, close) in res.items():
            assert same and close, key


def _decide_rank(rank, n):
    from ccddp.comm import collectives

    small = torch.ones(16)
    return {impl: collectives.exchanges(_group(impl), small) for impl in ("secure", "secure-naive")} | {
        "tree": collectives.exchanges(_group(algorithm="tree"), small)}


@pytest.mark.parametrize("world_size", [2, 3])
def test_only_a_two_rank_pipelined_ring_exchanges(world_size):
    for res in run_ranks(_decide_rank, world_size):
        assert res == {"secure": world_size == 2, "secure-naive": False, "tree": False}


def _mismatch_rank(rank, n):
    """One rank exchanges, the other runs the ring (another version, say): the descriptor
    says what differs; no frame of the wrong size is ever paired."""
    from ccddp.bench.reference import all_reduce
    from ccddp.comm import collectives
    from ccddp.errors import ConfigError

    if rank == 1:
        collectives.EXCHANGE_MAX_BYTES = 0
    g = _group()
    try:
        all_reduce(torch.ones(100), g)
    except ConfigError as e:
        return str(e)
    return "no error"


def test_ranks_that_choose_different_schedules_fail_with_what_differs():
    for msg in run_process_ranks(_mismatch_rank, 2):
        assert "exchange_all_reduce" in msg and "all_reduce of 100" in msg, msg


def test_sweep_preset_spells_out_powers_of_four():
    from ccddp.bench.options import SWEEP_SIZES, build_collectives_parser, check_collectives, expand_sizes, parse_size

    sizes = [parse_size(s) for s in SWEEP_SIZES.split(",")]
    assert sizes[0] == 4 << 10 and sizes[-1] == 64 << 20
    assert all(b == 4 * a for a, b in zip(sizes, sizes[1:]))
    assert expand_sizes("sweep") == SWEEP_SIZES
    assert expand_sizes("Sweep,128M") == SWEEP_SIZES + ",128M"
    assert expand_sizes("1M,64M") == "1M,64M"
    args = build_collectives_parser().parse_args(["--sizes", "sweep"])
    check_collectives(args)
    assert args.sizes == SWEEP_SIZES


def test_small_cuda_ops_are_staged_only_under_auto():
    from ccddp.backend.placement import STAGE_SMALL_BYTES, stages_small

    assert stages_small("auto", 4096) and stages_small("auto", STAGE_SMALL_BYTES)
    assert not stages_small("auto", STAGE_SMALL_BYTES + 1)
    assert not stages_small("device", 4096) and not stages_small("staged", 4096)


def test_probe_stages_add_up_and_belong_to_the_thread_that_began():
    import threading

    from ccddp.comm import probe

    probe.reset()
    assert probe.begin("op")
    assert not probe.begin("nested")            # nested: ignored
    probe.stamp("a")
    t = threading.Thread(target=probe.stamp, args=("other thread",))
    t.start()
    t.join()
    probe.stamp("b")
    probe.end("c")
    (op,) = probe.ops()["op"]
    assert list(op) == ["a", "b", "c"] and all(v >= 0 for v in op.values())
    probe.reset()


def test_probe_is_off_unless_asked_for():
    code = "from ccddp.comm import probe; print(probe.ON)"
    env_off = {k: v for k, v in __import__("os").environ.items() if k != "CCDDP_PROBE"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env_off, check=True)
    assert out.stdout.strip() == "False"


def test_operation_check_counts_an_exchange_as_one_seal_and_one_open():
    from ccddp.report.crypto_ops import check_run, expected_seals

    assert expected_seals(5, 2) == 10 and expected_seals(5, 2, 1) == 9 and expected_seals(5, 4) == 30
    run = {"cc": "on", "status": "ok", "world_size": 2, "key": "x", "result": {
        "allreduce_calls_per_iteration": 5, "exchanges_per_iteration": 1, "seals_per_rank": 9, "opens_per_rank": 9,
        "iterations": [{"allreduce_calls": 5, "exchanges": 1, "seals": 9, "opens": 9}]}}
    assert check_run(run)["ok"] is True
    # An exchange not counted as one is a mismatch, as before.
    res = {**run["result"], "exchanges_per_iteration": 0}
    assert check_run({**run, "result": res})["ok"] is False
    # Results written before issue 42 carry no exchange count: the ring's 2k(n-1).
    old = {**run, "result": {"allreduce_calls_per_iteration": 5, "seals_per_rank": 10, "opens_per_rank": 10}}
    assert check_run(old)["ok"] is True


# -- the prepared exchange (issue 42) ----------------------------------------------------

class _FakeGroup:
    """What a prepared op reads of a group, without a process group."""

    def __init__(self, rank=0, **kw):
        import types

        from ccddp.comm import CommSettings

        self.rank, self.session_id, self.settings_digest = rank, bytes(range(16)), b"\x07" * 16
        self.settings = CommSettings(impl="secure", **kw)
        self.transport = types.SimpleNamespace(host_device_types=frozenset({"cpu"}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_prepared_aads_equal_frame_context(dtype):
    from ccddp.comm.descriptors import FOLDED, FOLDED_DATA_MAX
    from ccddp.comm.descriptors import describe as _describe
    from ccddp.comm.prepared import PreparedExchange
    from ccddp.comm.plan import exchange_plan
    from ccddp.comm.reduce import Reduction
    from ccddp.crypto.aad import FrameContext, Op, Phase

    for rank in (0, 1):
        g = _FakeGroup(rank)
        p = PreparedExchange(g, 1000, dtype, Reduction.MAX)
        peer = 1 - rank
        name = str(dtype).removeprefix("torch.")
        # 1000 elements fit one message with the descriptor: the folded wire.
        desc = _describe(g, Op.EXCHANGE_ALL_REDUCE, 1000, name, 0, Reduction.MAX, FOLDED)
        assert p.desc == desc and p.peer == peer and p.folded
        assert not PreparedExchange(g, FOLDED_DATA_MAX // dtype.itemsize + 1, dtype, Reduction.MAX).folded
        (st,) = exchange_plan(rank, 1000)
        for seq in (1, 2, 255, 256, 1 << 40, (1 << 64) - 1):
            seq8 = seq.to_bytes(8, "big")
            want = {
                "d_tx_aad": FrameContext(g.session_id, seq, Op.DESCRIPTOR, Phase.NONE, 0, 0, rank, peer, len(desc), ""),
                "d_rx_aad": FrameContext(g.session_id, seq, Op.DESCRIPTOR, Phase.NONE, 0, 0, peer, rank, len(desc), ""),
                "x_tx_aad": FrameContext(g.session_id, seq, Op.EXCHANGE_ALL_REDUCE, st.phase, st.wire_step, 0,
                                         rank, peer, 1000 * dtype.itemsize, name),
                "x_rx_aad": FrameContext(g.session_id, seq, Op.EXCHANGE_ALL_REDUCE, st.phase, st.wire_step, 0,
                                         peer, rank, 1000 * dtype.itemsize, name)}
            for field, ctx in want.items():
                head, tail = getattr(p, field)
                assert head + seq8 + tail == ctx.pack(), (field, seq)


def test_a_changed_shape_gets_a_new_prepared_op():
    from ccddp.comm import prepared
    from ccddp.comm.reduce import Reduction
    from ccddp.crypto.aad import Op

    g = _FakeGroup()
    x = torch.ones(100)
    p = prepared.prepared_exchange(g, x, Reduction.SUM)
    assert p is not None and prepared.prepared_exchange(g, torch.zeros(100), Reduction.SUM) is p
    others = [prepared.prepared_exchange(g, torch.ones(101), Reduction.SUM),
              prepared.prepared_exchange(g, torch.ones(100, dtype=torch.float16), Reduction.SUM),
              prepared.prepared_exchange(g, x, Reduction.MAX)]
    assert len({id(o) for o in others + [p]}) == 4
    ex = Op.EXCHANGE_ALL_REDUCE
    assert [o.key for o in others] == [(ex, 101, torch.float32, Reduction.SUM, None),
                                       (ex, 100, torch.float16, Reduction.SUM, None),
                                       (ex, 100, torch.float32, Reduction.MAX, None)]
    assert others[0].x_rx_np.size == 101 * 4 + 16 and others[0].kept and others[1].opened.dtype == torch.float16
    # Another group has its own.
    assert prepared.prepared_exchange(_FakeGroup(), x, Reduction.SUM) is not p
    # The pipeline runs what is not one host frame each way.
    assert prepared.prepared_exchange(_FakeGroup(segment_bytes=1024), torch.ones(257), Reduction.SUM) is None
    assert prepared.prepared_exchange(_FakeGroup(segment_bytes=1024), torch.ones(256), Reduction.SUM) is not None
    assert prepared.prepared_exchange(_FakeGroup(check_descriptors=False), x, Reduction.SUM) is None
    assert prepared.prepared_exchange(g, torch.ones(0), Reduction.SUM) is None
    staged = _FakeGroup()
    staged.transport.host_device_types = frozenset()
    assert prepared.prepared_exchange(staged, x, Reduction.SUM) is None
    # Kept per group, least recently used dropped.
    many = _FakeGroup()
    first = prepared.prepared_exchange(many, torch.ones(1), Reduction.SUM)
    for n in range(2, prepared.PREPARED_MAX + 2):
        prepared.prepared_exchange(many, torch.ones(n), Reduction.SUM)
    assert len(prepared._PREPARED[many]) == prepared.PREPARED_MAX
    assert prepared.prepared_exchange(many, torch.ones(1), Reduction.SUM) is not first


def _prepared_rank(rank, n):
    """The prepared op against the pipeline: same bits, same counters, same nonces; a rank
    on either path paired with a rank on the other fails at once, saying why (the prepared
    op's data travels in its descriptor's message: every exchange's, up to 1 MiB)."""
    import torch.distributed as dist

    from ccddp.bench.reference import all_reduce
    from ccddp.comm import prepared
    from ccddp.comm.descriptors import FOLDED_DATA_MAX
    from ccddp.comm.reduce import Reduction
    from ccddp.crypto.counters import CryptoCounters
    from ccddp.errors import ConfigError

    nonces = []
    g = _group()
    g.recorder = lambda key_id, nonce: nonces.append((key_id, nonce))
    gen = torch.Generator().manual_seed(rank)
    out = {"same": [], "counters": [], "nonces": [], "mixed": []}
    try:
        for numel in (1, 33, 1024, 16384, 1 << 18):     # 1 MiB of float32: the arena's frames, in one message
            for dtype in (torch.float32, torch.bfloat16, torch.int32):
                reds = ("SUM", "MAX", "PRODUCT") if dtype != torch.int32 else ("SUM", "BXOR")
                for red in reds:
                    x = (torch.randn(numel, generator=gen) * 100).to(dtype)
                    got = {}
                    folded = numel * x.element_size() <= FOLDED_DATA_MAX
                    for mode in ("prepared", "pipeline") + (() if folded else ("mixed",)):
                        prepared.PREPARED = mode == "prepared" or (mode == "mixed" and rank == 0)
                        before, k = g.counters.snapshot(), len(nonces)
                        got[mode] = all_reduce(x.clone(), g, op=getattr(Reduction, red))
                        diff = CryptoCounters.diff(g.counters.snapshot(), before)
                        diff.pop("busy_seconds", None)
                        got[mode + " counters"] = diff
                        got[mode + " nonces"] = len(nonces) - k
                    everyone = [torch.empty_like(got["prepared"]) for _ in range(n)]
                    dist.all_gather(everyone, got["prepared"])
                    u8 = [t.view(torch.uint8) for t in [got["pipeline"], got.get("mixed", got["pipeline"])] + everyone]
                    out["same"].append(all(torch.equal(u8[0], b) for b in u8))
                    out["counters"].append(got["prepared counters"] == got["pipeline counters"]
                                           == got.get("mixed counters", got["pipeline counters"]))
                    out["nonces"].append(got["prepared nonces"] == got["pipeline nonces"] == 4)
                    out["mixed"].append(folded or "mixed" in got)
        # A small op with one rank on each path: the prepared rank sends its data in the
        # descriptor's message, the pipeline's apart. Both ranks say so at once (the
        # group is not used after: a failed collective leaves its links behind).
        prepared.PREPARED = rank == 0
        try:
            all_reduce(torch.ones(8), g)
            out["mixed small"] = [False]
        except ConfigError as e:
            out["mixed small"] = ["in the descriptor's message" in str(e) and "host memory" in str(e)]
    finally:
        prepared.PREPARED = True
        g.close()
    return {k: all(v) for k, v in out.items() if v} | {"cases": len(out["same"])}


def test_prepared_exchange_is_the_pipeline_frame_for_frame():
    for res in run_process_ranks(_prepared_rank, 2, timeout=300):
        assert res == {"same": True, "counters": True, "nonces": True, "mixed": True, "mixed small": True,
                       "cases": 5 * (3 + 3 + 2)}, res


def _tamper_rank(rank, n):
    """An attack on the prepared path's data frame: refused at that frame, nothing added."""
    import torch.distributed as dist

    from ccddp.bench.reference import all_reduce
    from ccddp.comm import CommSettings, SecureGroup, prepared
    from ccddp.comm.descriptors import DESC_FRAME
    from ccddp.comm.reduce import Reduction
    from ccddp.crypto import GroupSecret
    from ccddp.errors import IntegrityError
    from ccddp.testing.adversary import AdversarialTransport, Rule

    out = {}
    # One message per link and op: the sealed descriptor (DESC_FRAME bytes), then the data frame.
    data = 8 * DESC_FRAME
    for attack, ops, rule in (("flip", 1, Rule("flip", src=0, dst=1, nth=0, bit=data + 8 * 100 + 3)),
                              ("flip-tag", 1, Rule("flip", src=0, dst=1, nth=0, bit=data + 8 * (1024 * 4 + 5))),
                              ("flip-descriptor", 1, Rule("flip", src=0, dst=1, nth=0, bit=8 * 5 + 1)),
                              ("truncate", 1, Rule("truncate", src=0, dst=1, nth=0, keep=DESC_FRAME + 50)),
                              ("replay", 2, Rule("replay", src=0, dst=1, nth=1, back=1))):
        tr = AdversarialTransport(dist.group.WORLD, 10, tag=9)
        g = SecureGroup(CommSettings(impl="secure", timeout_s=10), secret=GroupSecret(SECRET), transport=tr)
        tr.arm([rule])
        try:
            for i in range(ops):
                x = torch.full((1024,), float(rank + 1))
                p = prepared.prepared_exchange(g, x, Reduction.SUM)
                try:
                    all_reduce(x, g)
                    out[attack, i] = ("ok", float(x[0]))
                except IntegrityError as e:
                    out[attack, i] = ("refused", float(x.max()), float(x.min()), bool((p.opened == 0).all()),
                                      e.label.collective, e.label.step)
                    break
        finally:
            g.close()
        dist.barrier()
    return out


def test_a_tampered_frame_on_the_prepared_path_is_refused_and_nothing_added():
    r0, r1 = run_process_ranks(_tamper_rank, 2, timeout=300)
    # The attacked rank: the frame fails, its input untouched (2.0, not 3.0), the opened
    # buffer zeroed; the other rank's frames were intact.
    assert r1[("flip", 0)][:4] == ("refused", 2.0, 2.0, True) and r1[("flip", 0)][4].startswith("exchange_all_reduce#")
    assert r1[("flip-tag", 0)][:4] == ("refused", 2.0, 2.0, True)
    # A replayed message (the last op's) fails at its head: the descriptor's nonce is stale.
    assert r1[("replay", 0)] == ("ok", 3.0) and r1[("replay", 1)][:3] == ("refused", 2.0, 2.0)
    assert r1[("replay", 1)][4].startswith("descriptor#")
    assert r0[("flip", 0)] == ("ok", 3.0) and r0[("replay", 1)] == ("ok", 3.0)
    # The descriptor at the head of the message is opened first: refused there, as a failed
    # tag (not a mismatch), before the data frame is looked at.
    assert r1[("flip-descriptor", 0)][:3] == ("refused", 2.0, 2.0)
    assert r1[("flip-descriptor", 0)][4].startswith("descriptor#")
    # A message cut short leaves older bytes in the receive: the data frame fails its tag.
    assert r1[("truncate", 0)][:4] == ("refused", 2.0, 2.0, True)
    assert r1[("truncate", 0)][4].startswith("exchange_all_reduce#")


def test_counter_totals_sum_every_field():
    from ccddp.crypto.counters import CryptoCounters

    a, b = CryptoCounters(), CryptoCounters()
    a.add_message(sealed=True)
    a.add_frame(True, 100, 0.5)
    b.add_exchange()
    b.add_frame(False, 7, 0.25)
    sa, sb = a.snapshot(), b.snapshot()
    assert CryptoCounters.total([sa]) == sa and CryptoCounters.total([sa]) is not sa
    assert CryptoCounters.total([sa, sb]) == {k: sa[k] + sb[k] for k in sa}
    assert CryptoCounters.total([]) == {k: 0 for k in sa}


# -- the prepared all-gather and reduce-scatter (issue 42, FSDP2's traffic) ------------------

def _ring_rank(rank, n):
    """Two-rank all-gather and reduce-scatter on the prepared path against the pipeline:
    same bits, same counter deltas, same nonce counts, and with chunks above 1 MiB a mixed
    pair (one rank on each path) that works -- the same frames on the wire."""
    import torch.distributed as dist

    from ccddp.bench.reference import all_gather, reduce_scatter
    from ccddp.comm import collectives, prepared
    from ccddp.comm.descriptors import FOLDED_DATA_MAX
    from ccddp.comm.reduce import Reduction
    from ccddp.crypto.counters import CryptoCounters

    taken = []
    real = collectives.run_prepared

    def seen(g, flat, p, reduction, *a, **k):
        taken.append(p.key[0].name)
        return real(g, flat, p, reduction, *a, **k)

    collectives.run_prepared = seen
    nonces = []
    g = _group()
    g.recorder = lambda key_id, nonce: nonces.append((key_id, nonce))
    gen = torch.Generator().manual_seed(rank)
    out = {"same": [], "counters": [], "nonces": [], "right": [], "mixed": []}
    cases = []
    # 300000: 600 KB (bfloat16) chunks, in the descriptor's message from the arena; 1.2 MB
    # (float32, int32) chunks, apart, as the pipeline sends them.
    for per in (1, 33, 1000, 300000):
        for dtype in (torch.float32, torch.bfloat16, torch.int32):
            cases.append((per, dtype, None))
    cases += [(None, torch.float32, [3, 5]), (None, torch.float32, [0, 7]), (None, torch.int32, [1000, 1]),
              (None, torch.float32, [5, 0])]
    try:
        for per, dtype, sizes in cases:
            mine = per if sizes is None else sizes[rank]
            total = 2 * per if sizes is None else sum(sizes)
            for kind in ("all_gather", "reduce_scatter"):
                reds = ("SUM",) if kind == "all_gather" else (("SUM", "MAX", "AVG") if dtype != torch.int32
                                                              else ("SUM", "BXOR"))
                for red in reds:
                    x = (torch.randn(mine if kind == "all_gather" else total, generator=gen) * 100).to(dtype)
                    got = {}
                    # Chunks of at most 1 MiB go in the descriptor's message: no mixed pair.
                    folded = (per if sizes is None else max(sizes)) * x.element_size() <= FOLDED_DATA_MAX
                    for mode in ("prepared", "pipeline") + (() if folded else ("mixed",)):
                        prepared.PREPARED = mode == "prepared" or (mode == "mixed" and rank == 0)
                        before, k, t = g.counters.snapshot(), len(nonces), len(taken)
                        if kind == "all_gather":
                            res = torch.full((total,), 7, dtype=dtype)
                            all_gather(res, x, g, sizes=sizes)
                        else:
                            res = torch.full((mine,), 7, dtype=dtype)
                            inp = x.clone()
                            reduce_scatter(res, inp, g, op=getattr(Reduction, red), sizes=sizes)
                            assert torch.equal(inp.view(torch.uint8), x.view(torch.uint8))
                        got[mode] = res
                        diff = CryptoCounters.diff(g.counters.snapshot(), before)
                        diff.pop("busy_seconds", None)
                        got[mode + " counters"] = diff
                        got[mode + " nonces"] = len(nonces) - k
                        got[mode + " path"] = len(taken) - t
                    # The prepared path ran where asked, the pipeline where not.
                    assert (got["prepared path"], got["pipeline path"], got.get("mixed path", rank == 0)) == (
                        1, 0, 1 if rank == 0 else 0), (kind, per, sizes, got)
                    u8 = [t.view(torch.uint8) for t in (got["prepared"], got["pipeline"], got.get("mixed", got["pipeline"]))]
                    out["same"].append(all(torch.equal(u8[0], b) for b in u8))
                    out["counters"].append(got["prepared counters"] == got["pipeline counters"]
                                           == got.get("mixed counters", got["pipeline counters"]))
                    out["mixed"].append(folded or "mixed" in got)
                    out["nonces"].append(got["prepared nonces"] == got["pipeline nonces"] == 4)
                    # Against plain torch.distributed.
                    if kind == "all_gather":
                        if sizes is None:
                            parts = [torch.empty(per, dtype=dtype) for _ in range(n)]
                            dist.all_gather(parts, x)
                            out["right"].append(torch.equal(torch.cat(parts).view(torch.uint8), u8[0]))
                    elif red == "SUM" and sizes is None:
                        ref = x.clone()
                        dist.all_reduce(ref)
                        out["right"].append(torch.equal(ref[rank * per:(rank + 1) * per].view(torch.uint8), u8[0]))
    finally:
        prepared.PREPARED = True
        collectives.run_prepared = real
        g.close()
    return {k: all(v) for k, v in out.items()} | {"cases": len(out["same"])}


def test_prepared_all_gather_and_reduce_scatter_are_the_pipeline_frame_for_frame():
    # 12 even cases x (1 all-gather + 3 or 2 reduce-scatters) + 4 uneven.
    even = 4 * (2 * (1 + 3) + (1 + 2))
    uneven = (1 + 3) * 3 + (1 + 2)
    for res in run_process_ranks(_ring_rank, 2, timeout=600):
        assert res == {"same": True, "counters": True, "nonces": True, "right": True, "mixed": True,
                       "cases": even + uneven}, res


def test_prepared_ring_only_for_one_host_frame_each_way():
    from ccddp.comm import prepared
    from ccddp.comm.reduce import Reduction
    from ccddp.crypto.aad import Op

    def group(**kw):
        g = _FakeGroup(**kw)
        g.world_size = 2
        return g

    g = group()
    p = prepared.prepared_ring(g, Op.ALL_GATHER, torch.ones(100), Reduction.SUM, None)
    assert p.key == (Op.ALL_GATHER, 100, torch.float32, Reduction.SUM, None)
    assert (p.send_region, p.recv_region, p.action) == ((0, 50), (50, 100), "copy") and p.opened is None
    q = prepared.prepared_ring(g, Op.REDUCE_SCATTER, torch.ones(100), Reduction.SUM, [(0, 30), (30, 100)])
    assert (q.send_region, q.recv_region, q.action) == ((30, 100), (0, 30), "reduce") and q.opened.numel() == 30
    assert prepared.prepared_ring(g, Op.ALL_GATHER, torch.ones(100), Reduction.SUM, None) is p
    # Segments: one frame each way, by the longer chunk.
    small = group(segment_bytes=1024)
    assert prepared.prepared_ring(small, Op.ALL_GATHER, torch.ones(512), Reduction.SUM, None) is not None
    assert prepared.prepared_ring(small, Op.ALL_GATHER, torch.ones(514), Reduction.SUM, None) is None
    assert prepared.prepared_ring(small, Op.REDUCE_SCATTER, torch.ones(300), Reduction.SUM,
                                  [(0, 257), (257, 300)]) is None
    assert prepared.prepared_ring(group(allgather="group-key"), Op.ALL_GATHER, torch.ones(8), Reduction.SUM,
                                  None) is None
    assert prepared.prepared_ring(group(allgather="group-key"), Op.REDUCE_SCATTER, torch.ones(8), Reduction.SUM,
                                  None) is not None
    assert prepared.prepared_ring(group(check_descriptors=False), Op.ALL_GATHER, torch.ones(8), Reduction.SUM,
                                  None) is None
    assert prepared.prepared_ring(g, Op.ALL_GATHER, torch.ones(0), Reduction.SUM, None) is None
    three = group()
    three.world_size = 3
    assert prepared.prepared_ring(three, Op.ALL_GATHER, torch.ones(9), Reduction.SUM, None) is None


@pytest.mark.parametrize("op", ["ALL_GATHER", "REDUCE_SCATTER"])
def test_prepared_ring_aads_equal_the_pipelines(op):
    from ccddp.comm.plan import ring_plan
    from ccddp.comm.prepared import PreparedExchange
    from ccddp.comm.reduce import Reduction
    from ccddp.crypto.aad import FrameContext, Op, Phase

    o = Op[op]
    for rank in (0, 1):
        for bounds in (None, ((0, 3), (3, 10))):
            g = _FakeGroup(rank)
            p = PreparedExchange(g, 10, torch.bfloat16, Reduction.SUM, o, bounds)
            (st,) = ring_plan(rank, 2, 10, op.lower(), list(bounds) if bounds else None)
            peer = 1 - rank
            sa, sb = st.send_region
            ra, rb = st.recv_region
            seq = 77
            for field, ctx in {
                    "x_tx_aad": FrameContext(g.session_id, seq, o, st.phase, st.wire_step, 0, rank, peer,
                                             (sb - sa) * 2, "bfloat16"),
                    "x_rx_aad": FrameContext(g.session_id, seq, o, st.phase, st.wire_step, 0, peer, rank,
                                             (rb - ra) * 2, "bfloat16")}.items():
                head, tail = getattr(p, field)
                assert head + seq.to_bytes(8, "big") + tail == ctx.pack(), (field, rank, bounds)
            assert st.phase is (Phase.ALL_GATHER if op == "ALL_GATHER" else Phase.REDUCE_SCATTER)


def _ring_tamper_rank(rank, n):
    """A flipped ciphertext byte of a prepared all-gather's or reduce-scatter's data frame:
    refused at that frame; the output region (all-gather) is zeroed, the output
    (reduce-scatter) untouched and the opened buffer zeroed."""
    import torch.distributed as dist

    from ccddp.bench.reference import all_gather, reduce_scatter
    from ccddp.comm import CommSettings, SecureGroup, prepared
    from ccddp.comm.descriptors import DESC_FRAME
    from ccddp.comm.reduce import Reduction
    from ccddp.crypto import GroupSecret
    from ccddp.crypto.aad import Op
    from ccddp.errors import IntegrityError
    from ccddp.testing.adversary import AdversarialTransport, Rule

    out = {}
    for kind in ("all_gather", "reduce_scatter"):
        # One message per link: the sealed descriptor, then the data frame.
        tr = AdversarialTransport(dist.group.WORLD, 10, tag=9)
        g = SecureGroup(CommSettings(impl="secure", timeout_s=10), secret=GroupSecret(SECRET), transport=tr)
        tr.arm([Rule("flip", src=0, dst=1, nth=0, bit=8 * (DESC_FRAME + 10) + 3)])
        try:
            if kind == "all_gather":
                x, res = torch.full((256,), float(rank + 1)), torch.full((512,), 9.0)
                p = prepared.prepared_ring(g, Op.ALL_GATHER, res, Reduction.SUM, None)
                call = lambda: all_gather(res, x, g)           # noqa: E731
            else:
                x, res = torch.full((512,), float(rank + 1)), torch.full((256,), 9.0)
                p = prepared.prepared_ring(g, Op.REDUCE_SCATTER, x, Reduction.SUM, None)
                call = lambda: reduce_scatter(res, x, g)       # noqa: E731
            try:
                call()
                out[kind] = ("ok", res.tolist()[::128])
            except IntegrityError as e:
                opened = None if p.opened is None else bool((p.opened == 0).all())
                out[kind] = ("refused", res.tolist()[::128], opened, e.label.collective.split("#")[0],
                             e.label.step)
        finally:
            g.close()
        dist.barrier()
    return out


def test_a_tampered_frame_of_a_prepared_all_gather_or_reduce_scatter_is_refused():
    r0, r1 = run_process_ranks(_ring_tamper_rank, 2, timeout=300)
    assert r0["all_gather"] == ("ok", [1.0, 1.0, 2.0, 2.0])
    assert r0["reduce_scatter"] == ("ok", [3.0, 3.0])
    # Rank 1's own chunk is in place, the peer's region zeroed by the failed open.
    assert r1["all_gather"] == ("refused", [0.0, 0.0, 2.0, 2.0], None, "all_gather", 0)
    assert r1["reduce_scatter"] == ("refused", [9.0, 9.0], True, "reduce_scatter", 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int32, torch.bool,
                                   torch.complex64])
def test_combine_into_an_output_is_the_in_place_combine(dtype):
    """A prepared reduce-scatter writes ``chunk (op) opened`` straight into its output:
    the same bits as the in-place combine on a copy, for every reduction of every dtype,
    and the chunk (the caller's input) is left as it was."""
    from ccddp.comm.reduce import Reduction
    from ccddp.errors import ConfigError

    g = torch.Generator().manual_seed(7)

    def draw():
        if dtype is torch.bool:
            return torch.rand(513, generator=g) > 0.5
        return (torch.randn(513, generator=g, dtype=torch.float64) * 9).to(dtype)

    for red in Reduction:
        try:
            red.check(dtype, "test")
        except ConfigError:
            continue
        region, incoming = draw(), draw()
        kept, in_place, out = region.clone(), region.clone(), torch.empty_like(region)
        red.combine(in_place, incoming)
        red.combine(region, incoming, out=out)
        assert torch.equal(region, kept), red
        assert in_place.view(torch.uint8).equal(out.view(torch.uint8)), red


# -- a small op's data in its descriptor's message (issue 42) ----------------------------------

def _other_collective_rank(rank, n):
    """Ranks that call different collectives, where one sends its data in the descriptor's
    message (a small two-rank op) and the other does not, or both do: each rank raises the
    ConfigError naming both calls at once -- no timeout, and no gloo abort, although one
    rank's message is longer than the other's descriptor (every tag-0 receive has room)."""
    import time

    import torch.distributed as dist

    from ccddp.bench.reference import all_gather, all_reduce
    from ccddp.errors import ConfigError

    calls = {
        # 1.2 MB chunks: a prepared all-gather whose data goes apart.
        "small all_reduce / large all_gather": (lambda g: all_reduce(torch.ones(16), g),
                                                lambda g: all_gather(torch.empty(600000), torch.ones(300000), g)),
        "small all_reduce / small all_gather": (lambda g: all_reduce(torch.ones(16), g),
                                                lambda g: all_gather(torch.empty(16), torch.ones(8), g)),
        # 2 MiB: the ring on the pipeline, whose descriptor exchange receives the small op's message.
        "ring all_reduce / 1 MiB all_reduce": (lambda g: all_reduce(torch.ones(1 << 19), g),
                                               lambda g: all_reduce(torch.ones(1 << 18), g)),
    }
    out = {}
    for case, pair in calls.items():
        g = _group()
        t0 = time.monotonic()
        try:
            pair[rank](g)
            out[case] = "ran"
        except ConfigError as e:
            out[case] = (str(e), time.monotonic() - t0 < 10)
        finally:
            g.close()
        dist.barrier()
    return out


def test_a_small_op_against_another_collective_fails_at_once_saying_what_differs():
    r0, r1 = run_process_ranks(_other_collective_rank, 2, timeout=300)
    for res in (r0, r1):
        for case, got in res.items():
            assert got != "ran" and got[1], (case, got)
            words, quick = got
            assert "differs between ranks" in words, (case, words)
    assert "exchange_all_reduce of 16 float32" in r0["small all_reduce / large all_gather"][0]
    assert "all_gather of 600000 float32" in r0["small all_reduce / large all_gather"][0]
    assert "all_gather of 16 float32" in r1["small all_reduce / small all_gather"][0]
    assert "all_reduce of 524288 float32" in r1["ring all_reduce / 1 MiB all_reduce"][0]
    assert "exchange_all_reduce of 262144 float32" in r0["ring all_reduce / 1 MiB all_reduce"][0]


def test_gloo_takes_a_shorter_message_into_a_longer_receive_and_leaves_the_rest():
    """What every tag-0 receive's spare room rests on (ccddp.comm.descriptors): gloo writes a
    message shorter than the receive into its first bytes and completes it; the rest keeps
    what it held. (A longer message makes gloo abort the process: never sent.)"""
    r0, r1 = run_process_ranks(_short_message_rank, 2, timeout=120)
    assert r1 == [1] * 10 + [7] * 90 and r0 == "sent"


def _short_message_rank(rank, n):
    from ccddp.comm import Transport
    from ccddp.errors import FrameLabel

    tr = Transport.open(None, 20)
    if rank == 0:
        tr.wait(tr.isend(torch.ones(10, dtype=torch.uint8), 1), 1, FrameLabel("0->1", "short", 0))
        return "sent"
    buf = torch.full((100,), 7, dtype=torch.uint8)
    tr.wait(tr.irecv(buf, 0), 0, FrameLabel("0->1", "short", 0))
    return buf.tolist()
