"""The ccddp backend, op by op, on real ranks: every c10d operation torch's tools use gives
what gloo's semantics say (inputs are a known function of the rank, so each rank checks
the exact expected result), refused operations name themselves, works complete off the
calling thread, internal links stay out of torch's group registry, and a tampered frame
fails the collective with a typed error."""

from __future__ import annotations

import pytest
import torch

from dist_util import RankFailure
from dist_util import run_ranks as run_process_ranks
from thread_ranks import run_thread_ranks as run_ranks

SECRET = "6f1d8a27c3e94b05d2a7f68e1c93b4d70e5a2f8c61b9d3e47a0c5f2e8d16b93a"


def _inp(r: int, shape=(6,), dtype=torch.float32) -> torch.Tensor:
    return (torch.arange(torch.Size(shape).numel(), dtype=torch.float64) * (r + 1) + r - 2.5).reshape(shape).to(dtype)


def _ops(rank, n):
    import os
    import threading

    import torch.distributed as dist

    os.environ["CCDDP_GROUP_SECRET"] = SECRET
    import ccddp.backend  # noqa: F401
    from ccddp.errors import ConfigError

    pg = dist.new_group(backend="ccddp")
    R = dist.ReduceOp
    everyone = [_inp(r) for r in range(n)]
    stack = torch.stack(everyone)
    bad = []

    def check(name, got, want):
        if not torch.equal(got, want):
            bad.append(f"{name}: {got.tolist()} != {want.tolist()}")

    for op, want in ((R.SUM, stack.sum(0)), (R.AVG, stack.sum(0) / n), (R.PRODUCT, stack.prod(0)),
                     (R.MIN, stack.min(0).values), (R.MAX, stack.max(0).values)):
        x = _inp(rank)
        dist.all_reduce(x, op=op, group=pg)
        # Ring order sums chunk by chunk; SUM/AVG/PRODUCT may differ from stack order by rounding.
        if not torch.allclose(x, want, rtol=1e-6, atol=1e-6):
            bad.append(f"all_reduce {op}: {x.tolist()} vs {want.tolist()}")
    ints = [torch.tensor([3, 5, 6, 12], dtype=torch.int64) * (r + 1) for r in range(n)]
    for op, fold in ((R.BAND, torch.bitwise_and), (R.BOR, torch.bitwise_or), (R.BXOR, torch.bitwise_xor)):
        x = ints[rank].clone()
        dist.all_reduce(x, op=op, group=pg)
        want = ints[0]
        for t in ints[1:]:
            want = fold(want, t)
        check(f"all_reduce {op}", x, want)
    x = _inp(rank, (3, 4)).t()  # not contiguous: computed in a copy, written back
    dist.all_reduce(x, group=pg)
    if not torch.allclose(x, sum(_inp(r, (3, 4)) for r in range(n)).t()):
        bad.append("all_reduce of a transposed tensor")
    x = _inp(rank)
    dist.broadcast(x, src=n - 1, group=pg)
    check("broadcast", x, everyone[n - 1])
    x = _inp(rank)
    dist.reduce(x, dst=0, op=R.MAX, group=pg)
    check("reduce", x, stack.max(0).values if rank == 0 else everyone[rank])
    sizes = [r + 1 for r in range(n)]  # uneven all-gather
    outs = [torch.empty(s) for s in sizes]
    dist.all_gather(outs, torch.full((sizes[rank],), float(rank)), group=pg)
    for r, o in enumerate(outs):
        check("all_gather uneven", o, torch.full((sizes[r],), float(r)))
    flat = torch.empty(n * 6)
    dist.all_gather_into_tensor(flat, _inp(rank), group=pg)
    check("all_gather_into_tensor", flat, torch.cat(everyone))
    ins = [_inp(rank, (s,)) for s in sizes]  # uneven reduce-scatter
    out = torch.empty(sizes[rank])
    dist.reduce_scatter(out, ins, group=pg)
    check("reduce_scatter uneven", out, sum(_inp(r, (sizes[rank],)) for r in range(n)))
    out = torch.empty(2)
    dist.reduce_scatter_tensor(out, _inp(rank, (2 * n,)), op=R.MIN, group=pg)
    want = torch.stack([_inp(r, (2 * n,)) for r in range(n)]).min(0).values[2 * rank:2 * rank + 2]
    check("reduce_scatter_tensor min", out, want)
    # all_to_all_single with uneven splits: rank r sends (p + 1) rows to rank p.
    send = torch.cat([torch.full((p + 1, 2), float(10 * rank + p)) for p in range(n)])
    recv = torch.empty((n * (rank + 1), 2))
    dist.all_to_all_single(recv, send, output_split_sizes=[rank + 1] * n, input_split_sizes=[p + 1 for p in range(n)],
                           group=pg)
    check("all_to_all_single", recv, torch.cat([torch.full((rank + 1, 2), float(10 * p + rank)) for p in range(n)]))
    outs = [torch.empty(2) for _ in range(n)]
    dist.all_to_all(outs, [torch.full((2,), float(10 * rank + p)) for p in range(n)], group=pg)
    check("all_to_all", torch.stack(outs), torch.stack([torch.full((2,), float(10 * p + rank)) for p in range(n)]))
    outs = [torch.empty(6) for _ in range(n)] if rank == 1 else None
    dist.gather(_inp(rank), outs, dst=1, group=pg)
    if rank == 1:
        check("gather", torch.stack(outs), stack)
    x = torch.empty(6)
    dist.scatter(x, [_inp(p) * 2 for p in range(n)] if rank == 0 else None, src=0, group=pg)
    check("scatter", x, _inp(rank) * 2)
    a, b = _inp(rank, (2, 3)), torch.arange(4.0) * (rank + 1)
    dist.all_reduce_coalesced([a, b], group=pg)
    check("all_reduce_coalesced a", a, stack.sum(0).view(2, 3))
    check("all_reduce_coalesced b", b, torch.arange(4.0) * sum(range(1, n + 1)))
    got = [None] * n
    dist.all_gather_object(got, {"rank": rank, "text": "x" * rank}, group=pg)
    if got != [{"rank": r, "text": "x" * r} for r in range(n)]:
        bad.append(f"all_gather_object: {got}")
    dist.barrier(group=pg)
    # Point to point, with tags, received in another order than sent.
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    s1 = dist.isend(torch.full((3,), 100.0 + rank), nxt, group=pg, tag=1)
    s2 = dist.isend(torch.full((5,), 200.0 + rank), nxt, group=pg, tag=2)
    r2, r1 = torch.empty(5), torch.empty(3)
    w2 = dist.irecv(r2, prv, group=pg, tag=2)
    w1 = dist.irecv(r1, prv, group=pg, tag=1)
    for w in (w2, w1, s1, s2):
        w.wait()
    check("irecv tag 1", r1, torch.full((3,), 100.0 + prv))
    check("irecv tag 2", r2, torch.full((5,), 200.0 + prv))
    ops = [dist.P2POp(dist.isend, torch.full((2,), float(rank)), nxt, pg),
           dist.P2POp(dist.irecv, r := torch.empty(2), prv, pg)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    check("batch_isend_irecv", r, torch.full((2,), float(prv)))
    if rank == 0:
        senders = set()
        for _ in range(n - 1):
            y = torch.empty(1)
            sender = dist.recv(y, group=pg, tag=9)  # from any rank
            senders.add(sender)
            if y.item() != 7.0 * sender:
                bad.append(f"recv from any rank: {y.item()} from {sender}")
        if senders != set(range(1, n)):
            bad.append(f"recv from any rank: senders {senders}")
    else:
        dist.send(torch.tensor([7.0 * rank]), 0, group=pg, tag=9)
    # Async: an op whose future is asked for runs on ccddp's thread, not the caller's. (The
    # thread a callback runs on is no test of that: a callback attached after the future
    # completed runs at once on the attaching thread.)
    work = dist.all_reduce(torch.ones(1 << 16), group=pg, async_op=True)
    work.get_future().wait()
    if work._ticket.thread in (None, threading.current_thread().name):
        bad.append(f"async all_reduce ran on {work._ticket.thread}")
    refused = {}
    for what, call in {
        "PREMUL_SUM": lambda: dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(2.0), group=pg),
        "AVG": lambda: dist.all_reduce(torch.ones(2, dtype=torch.int64), op=R.AVG, group=pg),
        "BAND": lambda: dist.all_reduce(torch.ones(2), op=R.BAND, group=pg),
        "sparse": lambda: dist.all_reduce(torch.ones(2).to_sparse(), group=pg),
    }.items():
        try:
            call()
            refused[what] = "ran"
        except ConfigError as e:
            refused[what] = str(e)
    from torch.distributed import distributed_c10d as c10d

    return {"bad": bad, "refused": refused, "groups": len(c10d._world.pg_map),
            "backend": dist.get_backend(pg), "name": pg.group_name}


@pytest.mark.parametrize("world_size", [3])
def test_every_op_gives_gloo_semantics(world_size):
    res = run_ranks(_ops, world_size, timeout=300)
    for rank, r in enumerate(res):
        assert r["bad"] == [], (rank, r["bad"])
        assert r["backend"] == "ccddp" and r["name"]
        # The default gloo group and the ccddp group; ccddp's internal links are not groups.
        assert r["groups"] == 2, r["groups"]
        for what, message in r["refused"].items():
            assert what.lower() in message.lower(), (what, message)


def _tampered(rank, n):
    import os

    import torch.distributed as dist

    os.environ["CCDDP_GROUP_SECRET"] = SECRET
    import ccddp.backend  # noqa: F401

    pg = dist.new_group(backend="ccddp", timeout=__import__("datetime").timedelta(seconds=20))
    g = pg.endpoint
    inner = g.transport

    class Flip:
        def isend(self, frame, dst, tag=0):
            if frame.numel() > 1024:  # a data frame, not the descriptor (which heads a small op's message)
                frame = frame.clone()
                frame[-20] ^= 1
            return inner.isend(frame, dst, tag)

        def __getattr__(self, name):
            return getattr(inner, name)

    if rank == 0:
        g.transport = Flip()
    dist.all_reduce(torch.ones(4096), group=pg)
    return "completed"


def test_tampered_frame_fails_the_collective_with_integrity_error():
    res = run_ranks(_tampered, 2, timeout=120, pg_timeout=20, return_failures=True)
    assert isinstance(res[1], RankFailure) and res[1].type_name == "IntegrityError", res[1]
    assert "0->1" in res[1].message and "all_reduce" in res[1].message


def _who_runs(rank, n):
    import os
    import threading
    import time

    import torch.distributed as dist

    os.environ["CCDDP_GROUP_SECRET"] = SECRET
    import ccddp.backend  # noqa: F401

    g1, g2 = dist.new_group(backend="ccddp"), dist.new_group(backend="ccddp")
    out = {}
    # Waited for at once: run by the waiting thread (no hand-off to the queue's worker).
    # The worker takes an op left unclaimed for 50 ms, which a preempted caller on a loaded
    # 2-core machine can be: of five tries, one on the caller's thread shows the path.
    ran_on, right = [], True
    for _ in range(5):
        work = dist.all_reduce(x := torch.ones(8), group=g1, async_op=True)
        work.wait()
        ran_on.append(work._ticket.thread)
        right = right and x.tolist() == [float(n)] * 8
    out["waited"] = threading.current_thread().name in ran_on and right
    # Never waited for or asked about: still runs (the worker's poll starts it).
    work = dist.all_reduce(y := torch.ones(8), group=g1, async_op=True)
    deadline = time.monotonic() + 10
    # Watched through the ticket (asking the work would start it): y[0] is final on rank 0
    # after the reduce-scatter, before the all-gather has filled the rest of y.
    while not work._ticket.finished and time.monotonic() < deadline:
        time.sleep(0.01)
    out["unwaited"] = work._ticket.finished and y.tolist() == [float(n)] * 8
    work.wait()
    # Two groups, issued in the same order on every rank, but rank 0 leaves its first op
    # unwaited while it blocks in the second: gloo's semantics say this completes.
    a, b = torch.ones(4), torch.ones(4)
    if rank == 0:
        wa = dist.all_reduce(a, group=g1, async_op=True)
        dist.all_reduce(b, group=g2)
        wa.wait()
    else:
        dist.all_reduce(a, group=g1)
        dist.all_reduce(b, group=g2)
    out["two groups"] = a.tolist() == b.tolist() == [float(n)] * 4
    return out


def test_waited_ops_run_on_the_caller_and_unwaited_ones_still_run():
    res = run_ranks(_who_runs, 2, timeout=120, pg_timeout=30)
    for rank, r in enumerate(res):
        assert r == {"waited": True, "unwaited": True, "two groups": True}, (rank, r)


def _counted_by_op(rank, n):
    import os

    import torch.distributed as dist

    os.environ["CCDDP_GROUP_SECRET"] = SECRET
    import ccddp.backend  # noqa: F401
    from ccddp.crypto.counters import CryptoCounters

    pg = dist.new_group(backend="ccddp")
    for _ in range(2):
        dist.all_reduce(torch.ones(1 << 12), group=pg)
    dist.broadcast(torch.ones(1 << 12), src=0, group=pg)
    # A point-to-point message posted while a collective is queued: counted apart from it.
    peer = 1 - rank
    work = dist.all_reduce(torch.ones(1 << 12), group=pg, async_op=True)
    sent = dist.isend(torch.ones(8), peer, group=pg)
    got = torch.empty(8)
    dist.recv(got, peer, group=pg)
    sent.wait()
    work.wait()
    by_op = pg.counters_by_op()
    p2p = CryptoCounters.diff(pg.crypto_counters(), CryptoCounters.total(list(by_op.values())))
    return {"ops": sorted(by_op), "all_reduce": pg.crypto_counters("all_reduce"),
            "broadcast": pg.crypto_counters("broadcast"), "never ran": pg.crypto_counters("scatter"), "p2p": p2p}


def test_crypto_counters_by_op():
    res = run_ranks(_counted_by_op, 2, timeout=120, pg_timeout=30)
    n = 2
    for rank, r in enumerate(res):
        assert r["ops"] == ["all_reduce", "broadcast"], r["ops"]
        # Each all-reduce of two ranks, 16 KiB: one exchange (issue 42), n-1 seals and opens
        # (the ring's 2(n-1) from three ranks or above 1 MiB); the descriptors count as control.
        assert r["all_reduce"]["seals"] == r["all_reduce"]["opens"] == 3 * (n - 1), (rank, r["all_reduce"])
        assert r["all_reduce"]["control_seals"] == r["all_reduce"]["control_opens"] == 3, (rank, r["all_reduce"])
        # The broadcast's chain from rank 0: rank 0 seals its one message, rank 1 opens it.
        assert (r["broadcast"]["seals"], r["broadcast"]["opens"]) == ((1, 0) if rank == 0 else (0, 1)), r
        assert set(r["never ran"].values()) == {0}
        # What no queued op counted: the one message each rank sent and the one it received.
        assert (r["p2p"]["seals"], r["p2p"]["opens"], r["p2p"]["control_seals"]) == (1, 1, 0), (rank, r["p2p"])


def _wire_choice(rank, n, made):
    import os

    import torch.distributed as dist

    os.environ["CCDDP_GROUP_SECRET"] = SECRET
    import ccddp.backend  # noqa: F401

    pg = dist.new_group(backend="ccddp")
    ticket = pg.queue.submit(pg._choosing_wire(lambda: None, torch.device("cuda", 0)), [], "choose a wire")
    pg.queue.wait(ticket, 60)
    exchange, reports = made[rank]
    return exchange != pg.endpoint.transport.exchange, reports, pg.device_wire


def test_the_gpu_reports_that_choose_the_device_wire_are_exchanged_sealed(monkeypatch):
    """At a group's first CUDA op the ranks exchange GPU reports (host name, GPU UUID) to
    choose NCCL or gloo for device frames: on the group's sealed control plane, not the
    plaintext setup exchange the host could read or answer differently per rank."""
    import ccddp.backend.process_group as process_group

    made = {}

    def device_wire(store, rank, size, settings, exchange, device):
        made[rank] = (exchange, exchange(f"nccl report of rank {rank}".encode()))
        return None

    monkeypatch.setattr(process_group, "device_wire", device_wire)
    res = run_ranks(_wire_choice, 2, made, timeout=120)
    want = [b"nccl report of rank 0", b"nccl report of rank 1"]
    assert res == [(True, want, "gloo")] * 2, res


def _edge_cases(rank, n):
    import os

    import torch.distributed as dist

    os.environ["CCDDP_GROUP_SECRET"] = SECRET
    import ccddp.backend  # noqa: F401
    from ccddp.errors import ConfigError

    pg = dist.new_group(backend="ccddp", timeout=__import__("datetime").timedelta(seconds=20))
    out = {}
    # Signed zeros: every rank ends with the same bytes (IEEE max(-0, +0) = +0, min = -0).
    for name, op in (("max", dist.ReduceOp.MAX), ("min", dist.ReduceOp.MIN)):
        x = torch.tensor([-0.0 if rank == 0 else 0.0, 0.0 if rank == 0 else -0.0, 1.5 * rank])
        dist.all_reduce(x, op=op, group=pg)
        out[name] = torch.signbit(x).tolist()
    # Arguments refused before the op is queued leave the group usable, as gloo's do.
    refused = []

    def rooted(options, root):
        o = options()
        o.rootRank = root
        return o

    # The group's own methods for the rooted ops (torch checks a subgroup's root first).
    for bad in (lambda: dist.all_to_all([torch.empty(2)] * (n + 1), [torch.ones(2)] * (n + 1), group=pg),
                lambda: pg.reduce([torch.ones(2)], rooted(dist.ReduceOptions, n + 3)),
                lambda: pg.gather([[torch.empty(2)] * n], [torch.ones(2)], rooted(dist.GatherOptions, n + 1)),
                lambda: pg.scatter([torch.empty(2)], [], rooted(dist.ScatterOptions, n + 1)),
                lambda: dist.send(torch.ones(2), (rank + 1) % n, group=pg, tag=-1)):
        try:
            bad()
            refused.append("accepted")
        except ConfigError as e:
            refused.append(str(e).split(":")[0])
    out["refused"] = refused
    # A parameter (a leaf that requires grad, channels-last: not contiguous) is broadcast
    # and written as gloo writes it.
    torch.manual_seed(rank)
    conv = torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
    for p in conv.parameters():
        dist.broadcast(p, 0, group=pg)
    out["params"] = float(sum(p.detach().double().sum() for p in conv.parameters()))
    x = torch.ones(3)
    dist.all_reduce(x, group=pg)
    out["after"] = x.tolist()
    return out


def test_signed_zeros_bad_arguments_and_parameters_behave_as_on_gloo():
    res = run_ranks(_edge_cases, 2, timeout=120)
    a, b = res
    assert a["max"] == b["max"] == [False, False, False], res
    assert a["min"] == b["min"] == [True, True, False], res
    assert a["refused"] == b["refused"] == ["all_to_all outputs", "reduce", "gather", "scatter", "send"], res
    assert a["params"] == b["params"] and a["after"] == b["after"] == [2.0, 2.0, 2.0], res


def _completions(rank, n):
    """What each op's work completes with (``work.result()`` and its future's value), on a
    gloo group and on a ccddp group, as nested lists of tensor shapes."""
    import datetime
    import os

    import torch.distributed as dist

    os.environ["CCDDP_GROUP_SECRET"] = SECRET
    import ccddp.backend  # noqa: F401

    def shapes(v):
        if isinstance(v, torch.Tensor):
            return list(v.shape)
        return [shapes(x) for x in v] if isinstance(v, list) else type(v).__name__

    out = {}
    for backend in ("gloo", "ccddp"):
        pg = dist.new_group(backend=backend, timeout=datetime.timedelta(seconds=20))

        def per_rank():
            return [torch.ones(2) for _ in range(n)]

        ops = {
            "all_reduce": lambda: dist.all_reduce(torch.ones(2), group=pg, async_op=True),
            "broadcast": lambda: dist.broadcast(torch.ones(2), 0, group=pg, async_op=True),
            "all_gather": lambda: dist.all_gather(per_rank(), torch.ones(2), group=pg, async_op=True),
            "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.ones(2 * n), torch.ones(2), group=pg,
                                                                          async_op=True),
            "all_to_all": lambda: dist.all_to_all(per_rank(), per_rank(), group=pg, async_op=True),
            "all_to_all_single": lambda: dist.all_to_all_single(torch.ones(2 * n), torch.ones(2 * n), group=pg,
                                                                async_op=True),
            "gather": lambda: dist.gather(torch.ones(2), per_rank() if rank == 0 else None, 0, group=pg,
                                          async_op=True),
            "scatter": lambda: dist.scatter(torch.ones(2), per_rank() if rank == 0 else None, 0, group=pg,
                                            async_op=True),
            "reduce": lambda: dist.reduce(torch.ones(2), 0, group=pg, async_op=True),
            "barrier": lambda: dist.barrier(group=pg, async_op=True),
        }
        for name, start in ops.items():
            work = start()
            work.wait()
            out[backend, name] = (shapes(work.result()), shapes(work.get_future().wait()))
    return out


def test_a_works_result_and_future_hold_what_gloos_hold():
    """all_gather's and gather's work completed with a list of one list (the c10d argument),
    where gloo's and NCCL's complete with the output list itself."""
    for rank, seen in enumerate(run_ranks(_completions, 2, timeout=120)):
        for (backend, name), value in seen.items():
            if backend != "gloo":
                continue
            if name == "all_gather_into_tensor":
                # gloo's value is its own implementation's chunk views; ccddp's is NCCL's.
                assert value == ([[2], [2]], [[2], [2]]) and seen["ccddp", name] == ([[4]], [[4]]), seen
            else:
                assert seen["ccddp", name] == value, (rank, name, value, seen["ccddp", name])
        assert seen["ccddp", "all_gather"] == ([[2], [2]], [[2], [2]])
        assert seen["ccddp", "gather"] == (([[2], [2]], [[2], [2]]) if rank == 0 else ([], []))


def _all_to_all_sizes(rank, n):
    import datetime
    import os

    import torch.distributed as dist

    os.environ["CCDDP_GROUP_SECRET"] = SECRET
    import ccddp.backend  # noqa: F401
    from ccddp.errors import ConfigError

    pg = dist.new_group(backend="ccddp", timeout=datetime.timedelta(seconds=20))
    seen = []
    # Uneven but agreed splits: rank 0 sends 1 element to rank 1, rank 1 sends 3 to rank 0.
    out = torch.zeros(4 if rank == 0 else 2)
    dist.all_to_all_single(out, torch.arange(2.0 + 2 * rank) + 10 * rank, [1, 3] if rank == 0 else [1, 1],
                           [1, 1] if rank == 0 else [3, 1], group=pg)
    seen.append(out.tolist())
    # Empty, with rows that do not split evenly: every part is empty (gloo takes it too).
    empty = torch.empty(3, 0)
    dist.all_to_all_single(empty, torch.empty(3, 0), group=pg)
    seen.append(list(empty.shape))
    # Splits the ranks disagree on in one direction only: rank 1 expects 2 elements of rank
    # 0's 1 (gloo aborts the process on the longer message it would meet).
    try:
        dist.all_to_all_single(torch.zeros(2 if rank == 0 else 3), torch.ones(2), [1, 1] if rank == 0 else [2, 1],
                               [1, 1], group=pg)
        seen.append("accepted")
    except ConfigError as e:
        seen.append(str(e))
    return seen


def test_all_to_all_sizes_the_ranks_disagree_on_are_a_config_error_on_both():
    """Per-pair sizes that differ between sender and receiver aborted the receiving process
    (gloo's reaction to a longer message than its receive): each pair's descriptor now holds
    both directions' counts, so both ranks raise a ConfigError that names them."""
    res = run_process_ranks(_all_to_all_sizes, 2, timeout=90)
    assert res[0][0] == [0.0, 10.0, 11.0, 12.0] and res[1][0] == [1.0, 13.0], res
    said = "collective #3, all_to_all of float32: the ranks' sizes differ: rank 0 sends rank 1 1 elements, " \
           "rank 1 expects 2"
    assert res[0][1] == res[1][1] == [3, 0], res
    assert res[0][2] == res[1][2] == said, res


def _any_source_reverse(rank, n):
    import os

    import torch.distributed as dist

    os.environ["CCDDP_GROUP_SECRET"] = SECRET
    import ccddp.backend  # noqa: F401

    got = {}
    for backend in ("gloo", "ccddp"):
        pg = dist.new_group(backend=backend)
        if rank == 0:
            for v in (1.0, 2.0, 3.0):
                dist.send(torch.full((2,), v), 1, group=pg, tag=5)
        else:
            bufs = [torch.zeros(2) for _ in range(3)]
            works = [pg.recv_anysource([b], 5) for b in bufs]
            works[2].wait(), works[0].wait(), works[1].wait()
            got[backend] = [b.tolist() for b in bufs]
        dist.barrier(group=pg)
    return got


def test_receives_from_any_rank_waited_out_of_order_get_their_messages_as_on_gloo():
    """Three receives from any rank, waited last first: each took its sender's counter when
    waited, so the last one opened the first message under the second one's nonce and failed
    its tag; gloo completes them in posting order, and so do their counters now."""
    got = run_ranks(_any_source_reverse, 2, timeout=120)[1]
    assert got["ccddp"] == got["gloo"] == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]], got


def _shorter_and_retyped_messages(rank, n):
    """Point-to-point messages into a larger receive and into another dtype, on gloo and on
    ccddp; then, on sealed links under a host that flips a bit of a message's length,
    what the receiver gets."""
    import datetime
    import os

    import torch.distributed as dist

    os.environ["CCDDP_GROUP_SECRET"] = SECRET
    import ccddp.backend  # noqa: F401
    from ccddp.comm import CommSettings, SecureGroup
    from ccddp.comm.p2p import SealedPeerLinks
    from ccddp.crypto.keys import GroupSecret
    from ccddp.testing.adversary import AdversarialTransport, Rule

    got = {}
    for backend in ("gloo", "ccddp"):
        pg = dist.new_group(backend=backend, timeout=datetime.timedelta(seconds=20))
        if rank == 0:
            dist.send(torch.arange(4.0), 1, group=pg, tag=3)
            dist.send(torch.tensor([1.5, -2.0]), 1, group=pg, tag=4)
        else:
            room = torch.full((8,), 7.0)
            dist.recv(room, 0, group=pg, tag=3)
            bits = torch.zeros(2, dtype=torch.int32)
            dist.recv(bits, 0, group=pg, tag=4)
            got[backend] = (room.tolist(), bits.tolist())
        dist.barrier(group=pg)
    tr = AdversarialTransport(dist.new_group(backend="gloo"), 10)
    links = SealedPeerLinks(SecureGroup(CommSettings(timeout_s=10), GroupSecret(bytes.fromhex(SECRET)),
                                        transport=tr), tr)
    # The length is the frame's first 8 bytes, big-endian: bit 56 is its lowest (16 -> 17
    # bytes, within the receive), bit 0 its highest byte's (beyond any receive).
    for tag, bit in ((5, 56), (6, 0)):
        tr.arm([Rule("flip", src=0, dst=1, nth=0, bit=bit)])
        if rank == 0:
            links.isend(torch.arange(4.0), 1, tag).wait()
        else:
            room = torch.full((8,), 7.0)
            try:
                links.irecv(room, 0, tag).wait()
                got[bit] = "accepted"
            except Exception as e:          # the typed error is the result
                got[bit] = (type(e).__name__, room.tolist())
        dist.barrier()
    return got


def test_a_shorter_message_fills_the_first_bytes_of_a_receive_as_on_gloo():
    """A message shorter than its receive failed authentication (the frame's length is the
    receive's) and closed that stream; another dtype of the same size was refused too. A
    message now starts with its length, bound by the AAD: a host that changes it gets the
    message refused, typed, with none of its bytes released."""
    got = run_ranks(_shorter_and_retyped_messages, 2, timeout=120)[1]
    retyped = torch.tensor([1.5, -2.0]).view(torch.int32).tolist()
    assert got["ccddp"] == got["gloo"] == ([0.0, 1.0, 2.0, 3.0, 7.0, 7.0, 7.0, 7.0], retyped), got
    assert got[56] == ("IntegrityError", [0.0] * 4 + [7.0] * 4), got
    assert got[0] == ("FrameFormatError", [7.0] * 8), got


def _made_again(rank, n):
    """The default group destroyed and made again, twice, on one store (as torch's env://
    store outlives destroy_process_group in a process), a ccddp subgroup each time."""
    import datetime
    import os

    import torch.distributed as dist

    os.environ["CCDDP_GROUP_SECRET"] = SECRET
    import ccddp.backend  # noqa: F401

    store = dist.PrefixStore("made-again", dist.distributed_c10d._get_default_store())
    sums = []
    for _ in range(3):
        dist.destroy_process_group()
        dist.init_process_group("ccddp", rank=rank, world_size=n, store=store, timeout=datetime.timedelta(seconds=8))
        x = torch.ones(2)
        dist.all_reduce(x)
        sub = dist.new_group(backend="ccddp")
        dist.all_reduce(x, group=sub)
        sums.append(x.tolist())
    return sums


def test_a_group_made_again_on_the_same_store_connects_afresh():
    """The internal links rendezvoused under the same keys each time, so a group made again
    on a store that outlived the last one (torch's env:// store does) read the addresses of
    the previous group's links, still open, and timed out; each instance has keys of its own
    now."""
    assert run_ranks(_made_again, 2, timeout=120) == [[[4.0, 4.0]] * 3] * 2
