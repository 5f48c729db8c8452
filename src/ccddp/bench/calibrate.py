"""``ccddp calibrate``: micro-benchmarks of this machine, written as a ``local`` hardware
profile for the performance model (``ccddp.sim``).

Only micro-benchmarks run here, never a training run, so a profile calibrated on a
machine can be checked against that machine's measured ``ccddp train`` runs
(``ccddp validate``) without being fitted to them. What is measured:

* in this process, on one thread (the ranks run with ``OMP_NUM_THREADS=1``): AES-256-GCM
  seal and open through :class:`~ccddp.crypto.LinkChannel` at several sizes (a
  least-squares line gives the per-call cost and the rate), the same on two threads at
  once (does a second crypto chain scale?), tensor add (the ring's reduction), memcpy
  (the input staging copy), the SGD step, an fp32 matmul (compute rate), XOR (pads);
* under ``torchrun`` on ``--world-size`` local ranks: gloo point-to-point ping-pong
  (latency) and ring streaming (every rank sends to its successor while it receives from
  its predecessor: the ring's bandwidth, and the CPU the loopback copies cost), and a
  secure all-reduce of many tiny segments, from which the per-message cost of the
  pipelined engine is solved through the model itself (so the model, fed this profile,
  reproduces that micro-benchmark). Larger secure, plaintext-ring and gloo all-reduces
  are measured too and reported beside the model's prediction as a check; they are not
  fitted.

Fields no micro-benchmark can give (the machine has no accelerator, no CC hardware, one
node) carry documented defaults, marked ``DEFAULT`` in the written profile.

Example::

    result = calibrate(world_size=2)
    write_profile(result["profile"], "local.toml", notes=result["notes"])

Run as a torchrun worker (``python -m ccddp.bench.calibrate --json OUT``) for the P2P part.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from typing import Any, Callable

import numpy as np

SCHEMA = "ccddp.calibrate/1"
KIB, MIB = 1 << 10, 1 << 20


# -- helpers -----------------------------------------------------------------------------

def _median_time(fn: Callable[[], Any], reps: int, warmup: int = 1) -> float:
    """Median wall seconds of ``fn()`` over ``reps`` calls (after ``warmup``)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _min_time(fn: Callable[[], Any], reps: int, warmup: int = 1) -> float:
    """Lower quartile of ``fn()``'s wall seconds: robust to another process stealing the
    core for a moment, which only ever makes a call slower."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 4]


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x``; returns ``(a, b)`` with ``a`` clipped at 0."""
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    # Weight by 1/y so the small sizes (which fix the intercept) count as much as the big
    # ones (which fix the slope): relative, not absolute, error is minimised.
    w = 1.0 / y
    A = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(A, y * w, rcond=None)
    return max(0.0, float(a)), float(b)


# -- single-process micro-benchmarks ----------------------------------------------------

def bench_crypto(sizes: list[int], reps: int) -> dict:
    """Seal/open through a LinkChannel (as the engines call it) on one thread.

    Returns per size the median seconds, and the fitted per-call cost and rate.
    """
    from ccddp.crypto import TAG_BYTES, FrameContext, LinkChannel, Op, Phase

    key = os.urandom(32)
    tx = LinkChannel(key, 1, "calibrate", rotate_after=1 << 62)
    rx = LinkChannel(key, 1, "calibrate", rotate_after=1 << 62)
    rows = []
    for n in sizes:
        data = np.frombuffer(os.urandom(n), dtype=np.uint8)
        frame = np.empty(n + TAG_BYTES, dtype=np.uint8)
        out = np.empty(n, dtype=np.uint8)
        aad = FrameContext(b"\0" * 16, 0, Op.ALL_REDUCE, Phase.REDUCE_SCATTER, 0, 0, 0, 1, n,
                           "float32").pack()
        seal_t, open_t = [], []
        for i in range(reps + 2):
            # The AAD is built per frame in the engines, so its cost is part of a call.
            t0 = time.perf_counter()
            a = FrameContext(b"\0" * 16, i, Op.ALL_REDUCE, Phase.REDUCE_SCATTER, 0, 0, 0, 1, n,
                             "float32").pack()
            tx.seal_job(data, frame, a)()
            t1 = time.perf_counter()
            a = FrameContext(b"\0" * 16, i, Op.ALL_REDUCE, Phase.REDUCE_SCATTER, 0, 0, 0, 1, n,
                             "float32").pack()
            rx.open_job(frame, out, a)()
            t2 = time.perf_counter()
            if i >= 2:
                seal_t.append(t1 - t0)
                open_t.append(t2 - t1)
        del aad
        seal_t.sort()
        open_t.sort()
        rows.append({"bytes": n, "seal_s": seal_t[len(seal_t) // 4],
                     "open_s": open_t[len(open_t) // 4]})
    a_s, b_s = fit_line([r["bytes"] for r in rows], [r["seal_s"] for r in rows])
    a_o, b_o = fit_line([r["bytes"] for r in rows], [r["open_s"] for r in rows])
    return {"rows": rows, "seal_fixed_us": a_s * 1e6, "open_fixed_us": a_o * 1e6,
            "seal_gbps": 1 / b_s / 1e9, "open_gbps": 1 / b_o / 1e9}


def bench_crypto_threads(nbytes: int, threads: int, reps: int) -> dict:
    """Aggregate seal rate of ``threads`` threads sealing at once (GIL released inside
    AES-GCM from 2 KiB): tells whether crypto chains scale on this host."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    aead = AESGCM(os.urandom(32))
    bufs = [(np.frombuffer(os.urandom(nbytes), dtype=np.uint8),
             np.empty(nbytes + 16, dtype=np.uint8)) for _ in range(threads)]
    nonce = os.urandom(12)

    def work(i: int) -> None:
        data, frame = bufs[i]
        for _ in range(reps):
            aead.encrypt_into(nonce, data, b"", frame)

    def run(k: int) -> float:
        ts = [threading.Thread(target=work, args=(i,)) for i in range(k)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return k * reps * nbytes / (time.perf_counter() - t0) / 1e9

    run(1)
    one = max(run(1) for _ in range(3))
    many = max(run(threads) for _ in range(3))
    return {"bytes": nbytes, "threads": threads, "one_thread_gbps": one,
            "all_threads_gbps": many, "scaling": many / one}


def bench_torch(fast: bool) -> dict:
    """Reduction (add), staging copy (clone), SGD step and matmul on one thread."""
    import torch

    torch.set_num_threads(1)
    reps = 5 if fast else 15
    out: dict[str, Any] = {}
    n = (8 if fast else 32) * MIB // 4
    a, b = torch.randn(n), torch.randn(n)
    t = _min_time(lambda: a.add_(b), reps)
    out["reduce_gbps"] = n * 4 / t / 1e9
    t = _min_time(lambda: a.clone(), reps)
    out["memcpy_gbps"] = n * 4 / t / 1e9
    # The training runs' optimizer: plain SGD on fp32 parameters (gradient bytes/s).
    params = [torch.nn.Parameter(torch.randn(n // 8)) for _ in range(8)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.SGD(params, lr=1e-3)
    t = _min_time(opt.step, reps)
    out["sgd_gbps"] = n * 4 / t / 1e9
    m = 256 if fast else 512
    x, y = torch.randn(m, m), torch.randn(m, m)
    t = _min_time(lambda: x @ y, reps)
    out["matmul_tflops"] = 2 * m ** 3 / t / 1e12
    u = np.frombuffer(os.urandom(n), dtype=np.uint8)
    v = np.frombuffer(os.urandom(n), dtype=np.uint8)
    w = np.empty_like(u)
    t = _min_time(lambda: np.bitwise_xor(u, v, out=w), reps)
    out["xor_gbps"] = n / t / 1e9
    return out


# -- P2P micro-benchmarks (torchrun worker) ---------------------------------------------

def _cpu_seconds() -> float:
    """CPU time of this process, all threads, user + system (gloo's socket threads and
    the kernel's loopback copies included)."""
    t = os.times()
    return t.user + t.system


def p2p_bench(fast: bool) -> dict:
    """Run on every rank; returns rank 0's view (the slowest rank for collectives)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, n = dist.get_rank(), dist.get_world_size()
    out: dict[str, Any] = {"world_size": n}
    nxt, prv = (rank + 1) % n, (rank - 1) % n

    # Latency: ping-pong of a tiny message between ranks 0 and 1 (the others wait).
    small = torch.zeros(16, dtype=torch.uint8)
    reps = 100 if fast else 400
    dist.barrier()
    rtts = []
    for i in range(reps + 10):
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(small, 1)
            dist.recv(small, 1)
        elif rank == 1:
            dist.recv(small, 0)
            dist.send(small, 0)
        if i >= 10:
            rtts.append(time.perf_counter() - t0)
    rtts.sort()
    out["rtt_us"] = rtts[len(rtts) // 4] * 1e6
    dist.barrier()

    # Ring streaming: everyone sends to its successor and receives from its predecessor,
    # as every step of a ring all-reduce does. Several sizes give latency + bytes/bw.
    rows = []
    for size in ([256 * KIB, 1 * MIB, 4 * MIB] if fast else [64 * KIB, 256 * KIB, 1 * MIB,
                                                                4 * MIB, 16 * MIB]):
        sbuf = torch.randint(0, 255, (size,), dtype=torch.uint8)
        rbuf = torch.empty(size, dtype=torch.uint8)
        k = max(3, min(40, (64 if not fast else 16) * MIB // size))
        times, cpus = [], []
        for it in range(4 if fast else 6):
            dist.barrier()
            c0, t0 = _cpu_seconds(), time.perf_counter()
            for _ in range(k):
                r = dist.irecv(rbuf, prv)
                s = dist.isend(sbuf, nxt)
                s.wait()
                r.wait()
            t1, c1 = time.perf_counter(), _cpu_seconds()
            if it > 0:
                times.append((t1 - t0) / k)
                cpus.append((c1 - c0) / k)
        rows.append({"bytes": size, "s": statistics.median(times),
                     "cpu_s": statistics.median(cpus)})
    out["stream"] = rows

    # Collectives: tiny-segment secure all-reduce (engine per-message cost), and larger
    # secure / ring / gloo all-reduces as a check of the model.
    from ccddp.comm import CommSettings, SecureGroup, all_reduce

    def allreduce_time(settings: CommSettings, nbytes: int, iters: int) -> float:
        g = SecureGroup(settings)
        x = torch.ones(max(n, nbytes // 4))
        times = []
        for i in range(iters + 1):
            dist.barrier()
            t0 = time.perf_counter()
            all_reduce(x, g)
            dt = time.perf_counter() - t0
            if i > 0:
                times.append(dt)
        g.close()
        t = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)   # the slowest rank defines it
        return float(t)

    tiny_seg = 4 * KIB        # above 2 KiB, where AES-GCM releases the GIL as real segments do
    tiny_bytes = n * 64 * tiny_seg
    out["tiny"] = {"bytes": tiny_bytes, "segment_bytes": tiny_seg, "chains": 2,
                   "secure_s": allreduce_time(CommSettings(impl="secure", segment_bytes=tiny_seg,
                                                           chains=2), tiny_bytes, 3 if fast else 5),
                   "ring_s": allreduce_time(CommSettings(impl="ring", segment_bytes=tiny_seg),
                                            tiny_bytes, 3 if fast else 5)}
    checks = []
    for size in ([4 * MIB] if fast else [4 * MIB, 32 * MIB]):
        for impl in ("gloo", "ring", "secure-naive", "secure"):
            s = CommSettings(impl=impl)
            checks.append({"impl": impl, "bytes": size, "segment_bytes": s.segment_bytes,
                           "chains": s.chains, "s": allreduce_time(s, size, 2 if fast else 3)})
    out["allreduce"] = checks
    return out


def worker_main() -> None:
    """torchrun entry: ``python -m ccddp.bench.calibrate --json OUT [--fast]``."""
    from ccddp.bench.worker import init_from_env

    p = argparse.ArgumentParser()
    p.add_argument("--json", required=True)
    p.add_argument("--fast", action="store_true")
    args = p.parse_args()
    init_from_env(120.0)
    import torch.distributed as dist

    result = p2p_bench(args.fast)
    if dist.get_rank() == 0:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    from ccddp.bench.worker import run_worker

    run_worker(worker_main)
