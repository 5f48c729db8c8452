"""``ccddp calibrate``: micro-benchmarks of this machine, written as a ``local`` hardware
profile for the performance model (``ccddp.sim``).

Only micro-benchmarks run here, never a training run, so a profile calibrated on a
machine can be checked against that machine's measured ``ccddp train`` runs
(``ccddp validate``) without being fitted to them. What is measured:

* under ``torchrun`` on ``--world-size`` local ranks, every rank at once (as ranks run in
  training: cores that share caches, memory bandwidth and clocks make each rank slower
  than one process alone), one thread per rank (ranks run with ``OMP_NUM_THREADS=1``):
  AES-256-GCM seal and open through :class:`~ccddp.crypto.LinkChannel` over a sweep of
  sizes (a weighted least-squares line gives the per-call cost and the per-byte rate
  separately, each with its standard error), tensor add (the ring's
  reduction), a 4 MiB clone (the input staging copy), the SGD step, an fp32 matmul
  (compute rate), XOR (pads);
* on the same ranks: gloo ping-pong (latency); ring streaming, every rank sending to its
  successor while receiving from its predecessor, with the CPU seconds it costs the rank
  (the loopback copies: ``link_cpu_gbps``); a secure all-reduce of many 4 KiB segments,
  whose CPU time gives the pipelined engine's per-message cost; ccddp's plaintext ring
  all-reduce, whose time gives the link rate a collective sees; a 4 KiB all-reduce, the
  pipelined engine and gloo taking turns, whose difference beyond what the model explains
  gives the sealed call's fixed cost (``op_fixed_us``). These three are solved
  through the model itself, so the model fed this profile reproduces those
  micro-benchmarks. Every measured all-reduce (gloo's, the plain ring's, the naive and
  the pipelined secure ones, two sizes) is set beside the model's prediction as a check,
  marked where a field was solved from it;
* in this process alone, the same crypto and tensor rates (kept for reference), and 1, 2,
  ... up to every core's thread sealing at once (how far crypto chains scale: the most
  measured is the envelope ``ccddp tune`` stays inside).

With ``--device cuda`` (:func:`calibrate_device`) it measures a GPU instead, in this
process: the Triton engine's per-call cost and per-byte rate over a sweep of sizes (the
code of ``ccddp bench channel --device cuda``, fitted as ``--device-sweep`` fits saved
results), OpenSSL on the same machine's host, and the pinned staging copies (device ->
host, host -> device) that placing a frame's crypto on the host would add; every other
field comes from a base profile.

Every field of the written profile carries its source: MEASURED here, DERIVED from the
machine's structure (no accelerator, no CC hardware, one node), or ASSUMED.

Example::

    result = calibrate(world_size=2)
    write_profile(result["profile"], "local.toml", header=result["header"])

Run as a torchrun worker (``python -m ccddp.bench.calibrate --json OUT``) for the P2P part.
Turning the measurements into a profile is :mod:`ccddp.bench.calibrate_fit`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from typing import Any, Callable

from ccddp.startup import pause_collector

pause_collector(__name__)  # run as a rank: the imports below without the cycle collector (ccddp.startup)
import numpy as np

from ccddp.bench.calibrate_fit import KIB, MIB, crypto_lines, derive_profile
from ccddp.bench.machine import process_cpu_seconds
from ccddp.comm.transport import all_gather_flat


# -- helpers -----------------------------------------------------------------------------

def _quartile_time(fn: Callable[[], Any], reps: int, warmup: int = 1) -> float:
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


# -- single-process micro-benchmarks ----------------------------------------------------

def bench_crypto(sizes: list[int], reps: int) -> dict:
    """Seal/open through a LinkChannel (as the engines call it) on one thread.

    Returns per size the lower-quartile seconds, and the per-call cost and per-byte rate
    of seal and open fitted separately with their standard errors (:func:`crypto_lines`).
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
    return {"rows": rows, **crypto_lines(rows)}


def bench_crypto_chains(nbytes: int, max_chains: int, reps: int) -> dict:
    """Aggregate seal rate of 1, 2, 4, ... up to ``max_chains`` threads sealing at once
    (GIL released inside AES-GCM from 2 KiB): how far crypto chains scale on this host,
    and the most chains measured (the envelope ``ccddp tune`` stays inside)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    aead = AESGCM(os.urandom(32))
    bufs = [(np.frombuffer(os.urandom(nbytes), dtype=np.uint8),
             np.empty(nbytes + 16, dtype=np.uint8)) for _ in range(max_chains)]
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
    counts = sorted({1, max_chains} | {2 ** i for i in range(8) if 2 ** i < max_chains})
    rows = [{"chains": k, "gbps": max(run(k) for _ in range(3))} for k in counts]
    return {"bytes": nbytes, "rows": rows, "max_chains": max_chains,
            "scaling": rows[-1]["gbps"] / rows[0]["gbps"]}


def bench_torch(fast: bool) -> dict:
    """Reduction (add), staging copy (clone), SGD step and matmul on one thread."""
    import torch

    torch.set_num_threads(1)
    reps = 5 if fast else 15
    out: dict[str, Any] = {}
    n = (8 if fast else 32) * MIB // 4
    a, b = torch.randn(n), torch.randn(n)
    t = _quartile_time(lambda: a.add_(b), reps)
    out["reduce_gbps"] = n * 4 / t / 1e9
    # The staging copy clones a batch (MiBs): allocations the allocator reuses. Large
    # clones would measure page faults of fresh mmaps instead (~1 GB/s here).
    c = torch.randn(MIB)
    t = _quartile_time(lambda: c.clone(), reps * 4)
    out["memcpy_gbps"] = c.numel() * 4 / t / 1e9
    # The training runs' optimizer: plain SGD on fp32 parameters (gradient bytes/s).
    params = [torch.nn.Parameter(torch.randn(n // 8)) for _ in range(8)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.SGD(params, lr=1e-3)
    t = _quartile_time(opt.step, reps)
    out["sgd_gbps"] = n * 4 / t / 1e9
    m = 256 if fast else 512
    x, y = torch.randn(m, m), torch.randn(m, m)
    t = _quartile_time(lambda: x @ y, reps)
    out["matmul_tflops"] = 2 * m ** 3 / t / 1e12
    u = np.frombuffer(os.urandom(n), dtype=np.uint8)
    v = np.frombuffer(os.urandom(n), dtype=np.uint8)
    w = np.empty_like(u)
    t = _quartile_time(lambda: np.bitwise_xor(u, v, out=w), reps)
    out["xor_gbps"] = n / t / 1e9
    return out


# -- P2P micro-benchmarks (torchrun worker) ---------------------------------------------

def bench_interference(fast: bool) -> dict:
    """Per rank, every rank at once: compute alone, AES-GCM alone, both on two threads;
    means over ranks of the medians of 3 repetitions."""
    import torch
    import torch.distributed as dist
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    conv = torch.nn.Conv2d(64, 64, 3, padding=1)
    x = torch.randn(2, 64, 28, 28)
    citers = 12 if fast else 40
    aead, nonce, seg = AESGCM(os.urandom(32)), os.urandom(12), 4 * MIB
    src = [np.frombuffer(os.urandom(seg), dtype=np.uint8) for _ in range(8)]
    dst = [np.empty(seg + 16, dtype=np.uint8) for _ in range(8)]
    xsegs = 24 if fast else 64

    def compute() -> None:
        for _ in range(citers):
            conv(x).sum().backward()

    def crypto() -> None:
        for i in range(xsegs):
            aead.encrypt_into(nonce, src[i % 8], b"", dst[i % 8])

    def both() -> None:
        t = threading.Thread(target=crypto)
        t.start()
        compute()
        t.join()

    def timed(fn) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    compute()
    crypto()
    runs: dict[str, list[float]] = {"compute_s": [], "crypto_s": [], "both_s": []}
    for _ in range(3):
        runs["compute_s"].append(timed(compute))
        runs["crypto_s"].append(timed(crypto))
        runs["both_s"].append(timed(both))
    mine = torch.tensor([statistics.median(runs[k]) for k in runs], dtype=torch.float64)
    dist.all_reduce(mine)
    c, xs, b = (mine / dist.get_world_size()).tolist()
    return {"compute_s": c, "crypto_s": xs, "both_s": b, "excess": b / (c + xs) - 1}


def p2p_bench(fast: bool) -> dict:
    """Run on every rank; returns rank 0's view (the slowest rank for collectives)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, n = dist.get_rank(), dist.get_world_size()
    out: dict[str, Any] = {"world_size": n}
    nxt, prv = (rank + 1) % n, (rank - 1) % n

    # Crypto, reduction, copy, optimizer and matmul rates with every rank running them at
    # once, as ranks do in training: cores that share caches, memory bandwidth and
    # clocks run each rank slower than one process alone (the single-process numbers
    # are kept beside these). The median over ranks.
    dist.barrier()
    sizes = [4 * KIB, 64 * KIB, 1 * MIB] if fast else [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB,
                                                         1 * MIB, 4 * MIB]
    crypto = bench_crypto(sizes, 8 if fast else 30)
    dist.barrier()
    rates = bench_torch(fast)
    keys = tuple(f"{op}_{q}" for op in ("seal", "open")
                 for q in ("fixed_us", "fixed_us_se", "gbps", "gbps_se"))
    mine = [crypto[k] for k in keys] + [rates[k] for k in sorted(rates)]
    everyone = torch.zeros(n * len(mine), dtype=torch.float64)
    all_gather_flat(everyone, torch.tensor(mine, dtype=torch.float64))
    med = everyone.view(n, len(mine)).median(dim=0).values.tolist()
    out["concurrent"] = dict(zip(list(keys) + sorted(rates), med))

    # Interference: a conv forward+backward loop (backward's kind of work) and an
    # AES-GCM loop (the comm thread's), alone and then on two threads of every rank at
    # once. Time-sharing alone would make "both" the sum; what exceeds it is what the
    # caches, memory bandwidth and switches between the two cost.
    out["interference"] = bench_interference(fast)

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
    # as every step of a ring all-reduce does, with several messages in flight (the
    # pipelined engine posts every receive up front). Several sizes give a line
    # (per-message cost + bytes / bandwidth); the process's CPU time over the same
    # window is what the transfers cost the rank's cores.
    rows = []
    total = (16 if fast else 32) * MIB
    for size in ([256 * KIB, 1 * MIB, 4 * MIB] if fast else [256 * KIB, 1 * MIB, 4 * MIB,
                                                                16 * MIB]):
        k = max(2, total // size)
        sbufs = [torch.randint(0, 255, (size,), dtype=torch.uint8) for _ in range(k)]
        rbufs = [torch.empty(size, dtype=torch.uint8) for _ in range(k)]
        times, cpus = [], []
        for it in range(4 if fast else 8):
            dist.barrier()
            c0, t0 = process_cpu_seconds(), time.perf_counter()
            recvs = [dist.irecv(b, prv) for b in rbufs]
            sends = [dist.isend(b, nxt) for b in sbufs]
            for w in sends + recvs:
                w.wait()
            t1, c1 = time.perf_counter(), process_cpu_seconds()
            if it > 0:
                times.append((t1 - t0) / k)
                cpus.append((c1 - c0) / k)
        rows.append({"bytes": size, "messages": k, "s": statistics.median(times),
                     "cpu_s": statistics.median(cpus)})
    out["stream"] = rows

    # Collectives: tiny-segment secure all-reduce (engine per-message cost), and larger
    # secure / ring / gloo all-reduces as a check of the model.
    from ccddp.bench.reference import IMPLS, all_reduce, open_impl
    from ccddp.comm import CommSettings

    def allreduce_time(impl: str, settings: CommSettings, nbytes: int, iters: int) -> tuple[float, float]:
        """(wall seconds of the slowest rank, CPU seconds of this rank) per all-reduce."""
        g = open_impl(impl, settings)
        x = torch.ones(max(n, nbytes // 4))
        times, cpus = [], []
        for i in range(iters + 1):
            dist.barrier()
            c0, t0 = process_cpu_seconds(), time.perf_counter()
            all_reduce(x, g)
            dt, dc = time.perf_counter() - t0, process_cpu_seconds() - c0
            if i > 0:
                times.append(dt)
                cpus.append(dc)
        g.close()
        t = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)   # the slowest rank defines it
        return float(t), statistics.median(cpus)

    # Tiny segments make the engine's per-message cost dominate. 4 KiB is above the 2 KiB
    # from which AES-GCM releases the GIL, as for real segments. Default (automatic)
    # chains: the engine the training runs use.
    tiny_seg = 4 * KIB
    tiny_bytes = n * 64 * tiny_seg
    tiny = CommSettings(impl="secure", segment_bytes=tiny_seg)
    sec_s, sec_cpu = allreduce_time("secure", tiny, tiny_bytes, 4 if fast else 8)
    ring_s, ring_cpu = allreduce_time("ring", tiny, tiny_bytes, 4 if fast else 8)
    out["tiny"] = {"bytes": tiny_bytes, "segment_bytes": tiny_seg,
                   "chains": tiny.resolved_chains(), "seg_hops": 2 * (n - 1) * 64,
                   "secure_s": sec_s, "secure_cpu_s": sec_cpu,
                   "ring_s": ring_s, "ring_cpu_s": ring_cpu}
    # The sealed call's fixed cost (op_fixed_us, issue 42): a small all-reduce, ccddp's
    # pipelined engine and gloo's own taking turns call by call (each after a barrier),
    # so both see the same load; the model explains part of the difference (seals, tags,
    # messages) and the profile's op_fixed_us is the rest.
    small_bytes = 4 * KIB
    small = CommSettings(impl="secure")
    groups = {impl: open_impl(impl, small) for impl in ("secure", "gloo")}
    xs = torch.ones(small_bytes // 4)
    small_t: dict[str, list[float]] = {"secure": [], "gloo": []}
    for i in range((20 if fast else 100) + 2):
        for impl, g in groups.items():
            dist.barrier()
            t0 = time.perf_counter()
            all_reduce(xs, g)
            if i >= 2:
                small_t[impl].append(time.perf_counter() - t0)
    for g in groups.values():
        g.close()
    med = torch.tensor([statistics.median(small_t["secure"]),
                        statistics.median(small_t["gloo"])], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)   # the slowest rank defines it
    out["small"] = {"bytes": small_bytes, "segment_bytes": small.segment_bytes,
                    "chains": small.resolved_chains(), "pairs": len(small_t["gloo"]),
                    "secure_s": float(med[0]), "gloo_s": float(med[1])}
    # The largest size also feeds the crypto and link fits (secure minus ring CPU; ring
    # time), so it gets the most repetitions.
    checks = []
    for size in ([4 * MIB] if fast else [4 * MIB, 64 * MIB]):
        for impl in IMPLS:
            cs = CommSettings()
            wall, cpu = allreduce_time(impl, cs, size, 3 if fast else (4 if size < 64 * MIB else 8))
            checks.append({"impl": impl, "bytes": size, "segment_bytes": cs.segment_bytes,
                           "chains": cs.resolved_chains(), "s": wall, "cpu_s": cpu})
    out["allreduce"] = checks
    return out


def run_p2p(world_size: int, fast: bool) -> dict:
    """Launch :func:`p2p_bench` on ``world_size`` local ranks through torchrun."""
    import tempfile

    from ccddp.bench.launch import torchrun

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "p2p.json")
        torchrun("ccddp.bench.calibrate", ["--json", out] + (["--fast"] if fast else []),
                 nproc=world_size, quiet=True, timeout_s=600)
        with open(out) as f:
            return json.load(f)


def calibrate(world_size: int = 2, *, fast: bool = False, name: str = "local",
              progress: Callable[[str], None] | None = None) -> dict:
    """Run every micro-benchmark; return ``{"profile", "header", "measurements",
    "checks", ...}`` (see :func:`derive_profile`). ``fast`` shrinks sizes and repetitions
    (tests)."""
    from ccddp.errors import ConfigError

    if world_size < 2:
        raise ConfigError(f"--world-size must be >= 2 (P2P needs a peer), got {world_size}")
    from ccddp.bench.machine import LoadMeter

    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    meter = LoadMeter()   # how loaded the machine was: the model check's errors depend on it
    say("AES-256-GCM seal/open over a sweep of sizes and chains (this process alone)")
    sizes = [4 * KIB, 64 * KIB, 1 * MIB] if fast else [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB,
                                                         1 * MIB, 4 * MIB]
    local = {"crypto": bench_crypto(sizes, 8 if fast else 40)}
    local["crypto_chains"] = bench_crypto_chains(MIB, os.cpu_count() or 1, 5 if fast else 20)
    say("reduction, copy, optimizer, matmul and XOR rates (this process alone)")
    local["torch"] = bench_torch(fast)
    say(f"every rank at once, P2P and all-reduces on {world_size} local ranks (torchrun)")
    p2p = run_p2p(world_size, fast)
    out = derive_profile(local, p2p, name=name)
    return {**out, "fast": fast, "seconds": time.perf_counter() - t0, "load": meter.stop()}


# -- a device: the Triton engine and host staging (one process, no ranks) ----------------

#: Sizes of the device sweep (``fast``: for checks).
DEVICE_SIZES = [64 * KIB, 256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB]
DEVICE_SIZES_FAST = [64 * KIB, 1 * MIB, 4 * MIB]
#: Sizes of the pinned-copy sweep.
STAGING_SIZES = [4 * KIB, 64 * KIB, 1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB]
STAGING_SIZES_FAST = [4 * KIB, 1 * MIB, 4 * MIB]


def bench_staging(sizes: list[int], reps: int, device: str = "cuda") -> list[dict]:
    """Per size, the lower-quartile seconds of a device -> pinned host copy and of a pinned
    host -> device copy, each from enqueue to the wait for it (what staging a frame
    through host OpenSSL costs on top of the crypto)."""
    import torch

    dev = torch.device(device)
    rows = []
    for n in sizes:
        on_device = torch.randint(0, 255, (n,), dtype=torch.uint8, device=dev)
        pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        back = torch.empty_like(on_device)

        def d2h() -> None:
            pinned.copy_(on_device, non_blocking=True)
            torch.cuda.synchronize(dev)

        def h2d() -> None:
            back.copy_(pinned, non_blocking=True)
            torch.cuda.synchronize(dev)

        rows.append({"bytes": n, "d2h_s": _quartile_time(d2h, reps, warmup=2),
                     "h2d_s": _quartile_time(h2d, reps, warmup=2)})
        if not torch.equal(back, on_device):
            raise AssertionError("a staging round trip changed the bytes")
    return rows


def calibrate_device(device: str = "cuda", *, fast: bool = False, base: str = "h100-cc",
                     name: str | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """Measure this machine's device engine and host staging; return ``{"profile",
    "header", "measured_fields", "measurements", ...}``: ``base`` (a profile name or path)
    with the fields :func:`ccddp.bench.calibrate_fit.device_records` fills measured here.

    The engine's sweep is ``ccddp bench channel --device cuda`` at each size (the same
    code: :func:`ccddp.bench.channel.bench_device`, every frame checked against OpenSSL),
    fitted by the same line as ``--device-sweep``; the staging copies are
    :func:`bench_staging`.

    Example::

        result = calibrate_device("cuda", base="h100-cc")
        write_profile(result["profile"], "gpu.toml", header=result["header"])
        result["measured_fields"]      # ["cpu_crypto_gbps", "crypto_op_us", ...]
    """
    import torch

    from ccddp.bench.calibrate_fit import device_records
    from ccddp.bench.channel import bench_device
    from ccddp.errors import ConfigError
    from ccddp.sim.profile import load_profile

    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        raise ConfigError(f"calibrate --device {device}: torch sees no CUDA device here")
    say = progress or (lambda _m: None)
    hw = load_profile(base)
    t0 = time.perf_counter()
    gpu = torch.cuda.get_device_name(torch.device(device))
    sweep = []
    for n in DEVICE_SIZES_FAST if fast else DEVICE_SIZES:
        say(f"the device engine at {n // KIB} KiB (ccddp bench channel --device {device})")
        r = bench_device(n, 3 if fast else 10, device)
        sweep.append({"schema": "ccddp.bench.channel-device/1", "gpu": gpu, **r})
    say("pinned host staging copies")
    staging = bench_staging(STAGING_SIZES_FAST if fast else STAGING_SIZES, 5 if fast else 20, device)
    measured = device_records(sweep, device=device, staging=staging)
    profile = hw.as_records()
    profile.update(measured)
    profile["name"] = name or hw.name
    header = [f"{profile['name']}: {hw.name} with the {gpu}'s AES-GCM engine and host staging measured by "
              f"`ccddp calibrate --device {device}`, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}.",
              f"measured here: {', '.join(sorted(measured))}; every other field is {hw.name}'s."]
    return {"schema": "ccddp.calibrate-device/1", "device": device, "gpu": gpu, "base": hw.name,
            "profile": profile, "header": header, "measured_fields": sorted(measured),
            "measurements": {"sweep": sweep, "staging": staging}, "fast": fast,
            "seconds": time.perf_counter() - t0}


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
