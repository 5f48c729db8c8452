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
    # The staging copy clones a batch (MiBs): allocations the allocator reuses. Large
    # clones would measure page faults of fresh mmaps instead (~1 GB/s here).
    c = torch.randn(MIB)
    t = _min_time(lambda: c.clone(), reps * 4)
    out["memcpy_gbps"] = c.numel() * 4 / t / 1e9
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
    the kernel's loopback copies included), to the microsecond (``os.times`` counts
    10 ms ticks)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


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
            c0, t0 = _cpu_seconds(), time.perf_counter()
            recvs = [dist.irecv(b, prv) for b in rbufs]
            sends = [dist.isend(b, nxt) for b in sbufs]
            for w in sends + recvs:
                w.wait()
            t1, c1 = time.perf_counter(), _cpu_seconds()
            if it > 0:
                times.append((t1 - t0) / k)
                cpus.append((c1 - c0) / k)
        rows.append({"bytes": size, "messages": k, "s": statistics.median(times),
                     "cpu_s": statistics.median(cpus)})
    out["stream"] = rows

    # Collectives: tiny-segment secure all-reduce (engine per-message cost), and larger
    # secure / ring / gloo all-reduces as a check of the model.
    from ccddp.comm import CommSettings, SecureGroup, all_reduce

    def allreduce_time(settings: CommSettings, nbytes: int, iters: int) -> tuple[float, float]:
        """(wall seconds of the slowest rank, CPU seconds of this rank) per all-reduce."""
        g = SecureGroup(settings)
        x = torch.ones(max(n, nbytes // 4))
        times, cpus = [], []
        for i in range(iters + 1):
            dist.barrier()
            c0, t0 = _cpu_seconds(), time.perf_counter()
            all_reduce(x, g)
            dt, dc = time.perf_counter() - t0, _cpu_seconds() - c0
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
    sec_s, sec_cpu = allreduce_time(tiny, tiny_bytes, 4 if fast else 8)
    ring_s, ring_cpu = allreduce_time(tiny.with_(impl="ring"), tiny_bytes, 4 if fast else 8)
    out["tiny"] = {"bytes": tiny_bytes, "segment_bytes": tiny_seg,
                   "chains": tiny.resolved_chains(), "seg_hops": 2 * (n - 1) * 64,
                   "secure_s": sec_s, "secure_cpu_s": sec_cpu,
                   "ring_s": ring_s, "ring_cpu_s": ring_cpu}
    checks = []
    for size in ([4 * MIB] if fast else [4 * MIB, 32 * MIB]):
        for impl in ("gloo", "ring", "secure-naive", "secure"):
            cs = CommSettings(impl=impl)
            wall, cpu = allreduce_time(cs, size, 2 if fast else 4)
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


# -- the profile ------------------------------------------------------------------------

def _launch_threads() -> int:
    """Compute threads of one rank as ``ccddp`` launches ranks (OMP_NUM_THREADS)."""
    from ccddp.bench.launch import job_env

    try:
        return max(1, int(job_env().get("OMP_NUM_THREADS", "1")))
    except ValueError:
        return 1


def build_profile(local: dict, p2p: dict, *, name: str = "local") -> tuple[dict, dict, list]:
    """(flat profile dict, notes per field, header lines) from the measurements.

    The segment overhead is left for :func:`fit_segment_overhead`, which needs the
    rest of the profile.
    """
    from ccddp.bench.machine import _cpu_model
    from ccddp.comm import CommSettings

    cores = os.cpu_count() or 1
    n = int(p2p["world_size"])
    crypto, torch_r = local["crypto"], local["torch"]
    threads = local["crypto_threads"]
    soft = max(1.0, n / cores)          # the model's contention factor for one-thread work
    stream = p2p["stream"]
    lat_s, per_b = fit_line([r["bytes"] for r in stream], [r["s"] for r in stream])
    link_gbps = soft / per_b / 1e9
    latency_us = p2p["rtt_us"] / 2
    # Core time per byte sent, from the largest messages (per-message costs amortised):
    # CPU seconds are not stretched by contention, so no correction for the ranks.
    big = [r for r in stream if r["bytes"] >= MIB] or stream
    link_cpu_gbps = sum(r["bytes"] for r in big) / sum(r["cpu_s"] for r in big) / 1e9
    chains = CommSettings().resolved_chains() if "LOCAL_WORLD_SIZE" in os.environ else \
        max(1, cores // n)
    d: dict[str, Any] = {
        "name": name,
        "description": f"{_cpu_model()}, {cores} cores shared by every rank, gloo loopback, "
                       "AES-256-GCM via cryptography (calibrated)",
        "gpus_per_node": 64,
        "compute_tflops": round(torch_r["matmul_tflops"], 5),
        "backward_ratio": 2.0,
        "optimizer_gbps": round(torch_r["sgd_gbps"], 4),
        "kernel_launch_us": 0.0,
        "cc_launch_toll": 1.0,
        "link_gbps": round(link_gbps, 4),
        "link_latency_us": round(latency_us, 2),
        "nvls": False,
        "link_encrypted": False,
        "reduce_gbps": round(torch_r["reduce_gbps"], 4),
        "segment_overhead_us": 0.0,
        "link_cpu_gbps": round(link_cpu_gbps, 4),
        "cc_exchange_toll_us": 0.0,
        "cc_bandwidth_kept": 1.0,
        "enc_gbps": round(crypto["seal_gbps"], 4),
        "dec_gbps": round(crypto["open_gbps"], 4),
        "mac_gbps": float("inf"),
        "mac_chains": chains,
        "max_chains": cores,
        "chains_scale_enc": True,
        "crypto_op_us": round((crypto["seal_fixed_us"] + crypto["open_fixed_us"]) / 2, 3),
        "tag_us": 0.0,
        "tag_bytes": 16.0,
        "xor_gbps": round(torch_r["xor_gbps"], 4),
        "crypto_unit": "chunk",
        "pcie_gbps": round(torch_r["memcpy_gbps"], 4),
        "cc_pcie_kept": 1.0,
        "cpu_crypto_gbps": round(crypto["seal_gbps"], 4),
        "cpu_crypto_threads": cores,
        "bounce_threads": 1,
        "bounce_pipelined": False,
        "input_path_shared": False,
        "inter_node_gbps": 1.25,
        "inter_node_latency_us": 50.0,
        "host_cores": cores,
        "compute_threads": _launch_threads(),
        "overlap_efficiency": 0.0,
    }
    sizes = ", ".join(f"{r['bytes'] // KIB} KiB" for r in crypto["rows"])
    notes = {
        "gpus_per_node": "DEFAULT: every rank runs on this one host",
        "compute_tflops": "MEASURED: fp32 matmul, one thread (used only for workloads "
                          "without measured phase times)",
        "backward_ratio": "DEFAULT: backward ~2x forward (only without measured times)",
        "optimizer_gbps": "MEASURED: torch.optim.SGD step, one thread",
        "kernel_launch_us": "DEFAULT: no accelerator, no kernel launches",
        "cc_launch_toll": "DEFAULT: no CC hardware",
        "link_gbps": f"MEASURED: gloo isend/irecv ring streaming (messages in flight) on "
                     f"{n} local ranks, slope of a line through {len(stream)} sizes"
                     + (f", times the model's {soft:g}x contention at {n} ranks" if soft > 1
                        else ""),
        "link_latency_us": "MEASURED: half the gloo ping-pong round trip of 16 B",
        "nvls": "DEFAULT: no switch reduction on a CPU host",
        "link_encrypted": "DEFAULT: loopback is plaintext",
        "reduce_gbps": "MEASURED: torch add_ of fp32 tensors, one thread",
        "segment_overhead_us": "MEASURED: solved through the model from the CPU time of a "
                               "secure all-reduce of many 4 KiB segments (its wall time "
                               "gives a larger value, in ccddp calibrate --json: wake-ups)",
        "link_cpu_gbps": "MEASURED: bytes sent per CPU-second of a rank (all its threads, "
                         "user + system) during the ring streaming, messages >= 1 MiB",
        "cc_exchange_toll_us": "DEFAULT: no CC hardware",
        "cc_bandwidth_kept": "DEFAULT: no CC hardware",
        "enc_gbps": f"MEASURED: LinkChannel seal, one thread, slope over {sizes}",
        "dec_gbps": "MEASURED: LinkChannel open, one thread, same sizes",
        "mac_gbps": "DEFAULT: OpenSSL stitches GHASH into the AES-GCM rates above",
        "mac_chains": f"DEFAULT: ccddp.comm's automatic chains for {n} ranks on {cores} cores",
        "max_chains": "DEFAULT: cores of the host",
        "chains_scale_enc": "DEFAULT: chains are threads running whole AES-GCM; measured "
                            f"{threads['threads']} threads at once: "
                            f"{threads['scaling']:.2f}x one thread",
        "crypto_op_us": "MEASURED: intercept of the seal/open lines (AAD, nonce, call)",
        "tag_us": "DEFAULT: the tag is part of each call, already in crypto_op_us",
        "tag_bytes": "DEFAULT: the 16-byte GCM tag ccddp sends",
        "xor_gbps": "MEASURED: numpy XOR, one thread (pads: model only)",
        "crypto_unit": "DEFAULT: ccddp's ring seals chunks",
        "pcie_gbps": "MEASURED: torch clone of 4 MiB (the CC-off staging copy of a batch), "
                     "one thread",
        "cc_pcie_kept": "DEFAULT: no CC bounce hardware",
        "cpu_crypto_gbps": "MEASURED: as enc_gbps (the bounce path seals on the CPU)",
        "cpu_crypto_threads": "DEFAULT: cores of the host",
        "bounce_threads": "DEFAULT: ccddp seals a batch on the training thread",
        "bounce_pipelined": "DEFAULT: ccddp seals, copies and opens one after another",
        "input_path_shared": "DEFAULT: each rank makes its own batch",
        "inter_node_gbps": "DEFAULT: 10 GbE, unused on one host",
        "inter_node_latency_us": "DEFAULT: unused on one host",
        "host_cores": "MEASURED: os.cpu_count()",
        "compute_threads": "DEFAULT: OMP_NUM_THREADS of ranks ccddp launches",
        "overlap_efficiency": "DEFAULT: the comm thread and backward share the same cores",
    }
    header = [f"{name}: calibrated by `ccddp calibrate` on {_cpu_model()} ({cores} cores), "
              f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}.",
              "MEASURED: from this machine's micro-benchmarks (never from training runs).",
              "DEFAULT: what no micro-benchmark here can measure; the reason is given."]
    return d, notes, header


def fit_segment_overhead(hw, tiny: dict, n: int, *, quantity: str = "cpu") -> float:
    """The per-message cost (us) at which the model reproduces the secure all-reduce of
    many tiny segments: its core time (``quantity="cpu"``: the model's busy time against
    the rank's measured CPU seconds, all threads) or its wall time (``"wall"``).

    The profile takes the CPU fit: a message's software cost is core time, which
    competes with backward; the wall fit also holds the VM's wake-up latencies, which
    waiting for tiny segments exposes but large segments hide (reported for comparison).
    """
    from ccddp.sim.collective import secure_allreduce
    from ccddp.sim.rates import Rates
    from ccddp.sim.schedule import Schedule

    sched = Schedule("pipelined", segment_bytes=tiny["segment_bytes"], chains=tiny["chains"])
    if quantity == "cpu":
        # The model's busy time is core time stretched by the ranks sharing the cores.
        target = tiny["secure_cpu_s"] * 1e3 * max(1.0, n / hw.host_cores)
    else:
        target = tiny["secure_s"] * 1e3

    def model_ms(us: float) -> float:
        h = hw.replace(segment_overhead_us=us)
        c = secure_allreduce(Rates.resolve(h, sched, n, True), sched, n, tiny["bytes"])
        return c.busy_ms if quantity == "cpu" else c.ms

    lo, hi = 0.0, 1.0
    if model_ms(lo) >= target:
        return 0.0
    while model_ms(hi) < target and hi < 1e6:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if model_ms(mid) < target else (lo, mid)
    return round((lo + hi) / 2, 2)


def model_checks(hw, p2p: dict) -> list[dict]:
    """The measured all-reduces beside what the model predicts for them: wall time, and
    core time (the model's busy time against the rank's CPU seconds)."""
    from ccddp.sim.collective import plain_allreduce, secure_allreduce
    from ccddp.sim.rates import Rates
    from ccddp.sim.schedule import Schedule

    n = int(p2p["world_size"])
    soft = max(1.0, n / hw.host_cores) if hw.host_cores > 0 else 1.0
    out = []
    for row in p2p["allreduce"]:
        impl, nbytes = row["impl"], row["bytes"]
        if impl == "gloo":
            c = plain_allreduce(Rates.resolve(hw, Schedule(), n, False), n, nbytes, False)
        else:
            sched = Schedule("naive" if impl == "secure-naive" else "pipelined",
                             segment_bytes=row["segment_bytes"], chains=row["chains"])
            r = Rates.resolve(hw, sched, n, True)
            if impl == "ring":
                r = r.without_crypto()
            c = secure_allreduce(r, sched, n, nbytes)
        measured = row["s"] * 1e3
        out.append({**row, "measured_ms": measured, "model_ms": c.ms,
                    "error": c.ms / measured - 1 if measured > 0 else None,
                    "measured_cpu_ms": row.get("cpu_s", 0.0) * 1e3,
                    "model_cpu_ms": c.busy_ms / soft})
    return out


def calibrate(world_size: int = 2, *, fast: bool = False, name: str = "local",
              progress: Callable[[str], None] | None = None) -> dict:
    """Run every micro-benchmark; return ``{"profile", "notes", "header", "measurements",
    "checks"}``. ``fast`` shrinks sizes and repetitions (tests)."""
    from ccddp.errors import ConfigError
    from ccddp.sim.profile import validate_profile

    if world_size < 2:
        raise ConfigError(f"--world-size must be >= 2 (P2P needs a peer), got {world_size}")
    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    say("AES-256-GCM seal/open rates and per-call cost")
    sizes = [4 * KIB, 64 * KIB, 1 * MIB] if fast else [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB,
                                                         1 * MIB, 4 * MIB]
    local = {"crypto": bench_crypto(sizes, 8 if fast else 40)}
    local["crypto_threads"] = bench_crypto_threads(MIB, min(2, os.cpu_count() or 1),
                                                   5 if fast else 20)
    say("reduction, copy, optimizer, matmul and XOR rates")
    local["torch"] = bench_torch(fast)
    say(f"gloo P2P and all-reduces on {world_size} local ranks (torchrun)")
    p2p = run_p2p(world_size, fast)
    d, notes, header = build_profile(local, p2p, name=name)
    hw = validate_profile(d, source="calibrate")
    d["segment_overhead_us"] = fit_segment_overhead(hw, p2p["tiny"], world_size)
    wall_us = fit_segment_overhead(hw, p2p["tiny"], world_size, quantity="wall")
    hw = validate_profile(d, source="calibrate")
    return {"schema": SCHEMA, "world_size": world_size, "fast": fast, "profile": d,
            "notes": notes, "header": header,
            "measurements": {"local": local, "p2p": p2p,
                             "segment_overhead_wall_fit_us": wall_us},
            "checks": model_checks(hw, p2p), "seconds": time.perf_counter() - t0}


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
