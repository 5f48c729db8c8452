"""From ``ccddp calibrate``'s measurements to a hardware profile.

:func:`derive_profile` takes the measurement dicts :mod:`ccddp.bench.calibrate` collects
(or a saved ``ccddp calibrate --json`` file's ``measurements``) and returns the profile,
a note per field saying where its value came from, the header, and the model's
predictions beside the measured all-reduces. Arithmetic only, but for this machine's
core count, CPU description and launch settings, which it reads (so re-derive a saved
calibration on the machine it was measured on). Rates come straight from the
micro-benchmarks where they can; the per-message cost, the engine's in-flight AES-GCM
rate and the link rate a collective sees are solved through the model itself, so the
model fed this profile reproduces the micro-benchmarks they came from.

Example::

    import json
    from ccddp.sim.profile import write_profile

    saved = json.load(open("calibrate.json"))["measurements"]
    result = derive_profile(saved["local"], saved["p2p"])
    write_profile(result["profile"], "local.toml", notes=result["notes"], header=result["header"])
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

SCHEMA = "ccddp.calibrate/1"
KIB, MIB = 1 << 10, 1 << 20


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x``; returns ``(a, b)`` with ``a`` clipped at 0."""
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    # Weight by 1/y so the small sizes (which fix the intercept) count as much as the big
    # ones (which fix the slope): relative, not absolute, error is minimised.
    w = 1.0 / y
    A = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(A, y * w, rcond=None)
    return max(0.0, float(a)), float(b)


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
    from ccddp.bench.machine import _cpu_model, cpu_details
    from ccddp.comm import CommSettings

    cores = os.cpu_count() or 1
    n = int(p2p["world_size"])
    # Rates measured with every rank busy at once; the model's own contention factor
    # for n ranks on these cores is divided out (1 while ranks <= cores).
    conc = p2p.get("concurrent")
    soft = max(1.0, n / cores)          # the model's contention factor for one-thread work
    if conc:
        crypto = {"seal_fixed_us": conc["seal_fixed_us"] / soft,
                  "open_fixed_us": conc["open_fixed_us"] / soft,
                  "seal_gbps": conc["seal_gbps"] * soft, "open_gbps": conc["open_gbps"] * soft,
                  "rows": local["crypto"]["rows"]}
        torch_r = {k: conc[k] * soft for k in local["torch"]}
        how = f"one thread per rank, {n} ranks at once"
    else:
        crypto, torch_r = local["crypto"], local["torch"]
        how = "one thread"
    threads = local["crypto_threads"]
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
        "interference": 0.0,
    }
    inter = p2p.get("interference")
    if inter:
        # Measured at n ranks; the model scales it by the compute threads per core.
        per_core = max(1.0, n * d["compute_threads"] / cores)
        d["interference"] = round(max(0.0, inter["excess"]) / per_core, 4)
    sizes = ", ".join(f"{r['bytes'] // KIB} KiB" for r in crypto["rows"])
    notes = {
        "gpus_per_node": "DEFAULT: every rank runs on this one host",
        "compute_tflops": f"MEASURED: fp32 matmul, {how} (used only for workloads "
                          "without measured phase times)",
        "backward_ratio": "DEFAULT: backward ~2x forward (only without measured times)",
        "optimizer_gbps": f"MEASURED: torch.optim.SGD step, {how}",
        "kernel_launch_us": "DEFAULT: no accelerator, no kernel launches",
        "cc_launch_toll": "DEFAULT: no CC hardware",
        "link_gbps": f"MEASURED: gloo isend/irecv ring streaming (messages in flight) on "
                     f"{n} local ranks, slope of a line through {len(stream)} sizes"
                     + (f", times the model's {soft:g}x contention at {n} ranks" if soft > 1
                        else ""),
        "link_latency_us": "MEASURED: half the gloo ping-pong round trip of 16 B",
        "nvls": "DEFAULT: no switch reduction on a CPU host",
        "link_encrypted": "DEFAULT: loopback is plaintext",
        "reduce_gbps": f"MEASURED: torch add_ of fp32 tensors, {how}",
        "segment_overhead_us": "MEASURED: solved through the model from the CPU time of a "
                               "secure all-reduce of many 4 KiB segments (its wall time "
                               "gives a larger value, in ccddp calibrate --json: wake-ups)",
        "link_cpu_gbps": "MEASURED: bytes sent per CPU-second of a rank (all its threads, "
                         "user + system) during the ring streaming, messages >= 1 MiB",
        "cc_exchange_toll_us": "DEFAULT: no CC hardware",
        "cc_bandwidth_kept": "DEFAULT: no CC hardware",
        "enc_gbps": f"MEASURED: LinkChannel seal, {how}, slope over {sizes}",
        "dec_gbps": f"MEASURED: LinkChannel open, {how}, same sizes",
        "mac_gbps": "DEFAULT: OpenSSL stitches GHASH into the AES-GCM rates above",
        "mac_chains": f"DEFAULT: ccddp.comm's automatic chains for {n} ranks on {cores} cores",
        "max_chains": "DEFAULT: cores of the host",
        "chains_scale_enc": "DEFAULT: chains are threads running whole AES-GCM; measured "
                            f"{threads['threads']} threads at once: "
                            f"{threads['scaling']:.2f}x one thread",
        "crypto_op_us": "MEASURED: intercept of the seal/open lines (AAD, nonce, call)",
        "tag_us": "DEFAULT: the tag is part of each call, already in crypto_op_us",
        "tag_bytes": "DEFAULT: the 16-byte GCM tag ccddp sends",
        "xor_gbps": f"MEASURED: numpy XOR, {how} (pads: model only)",
        "crypto_unit": "DEFAULT: ccddp's ring seals chunks",
        "pcie_gbps": f"MEASURED: torch clone of 4 MiB (the CC-off staging copy of a "
                     f"batch), {how}",
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
        "interference": (f"MEASURED: conv forward+backward and AES-GCM on two threads of each "
                         f"of {n} ranks at once, against the sum of each alone "
                         f"(+{inter['excess']:.1%} at {n} ranks)" if inter else
                         "DEFAULT: not measured"),
    }
    cpu = cpu_details()
    header = [f"{name}: calibrated by `ccddp calibrate` on {_cpu_model()} ({cores} cores), "
              f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}.",
              # The CPU model name does not say which AES-GCM code path OpenSSL takes.
              f"CPU family {cpu['cpu_family']} model {cpu['cpu_model_number']}, AES-related "
              f"flags: {' '.join(cpu['aes_flags']) or 'none'}; {cpu['openssl']}.",
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


def fit_link_rate(hw, ring: dict, n: int) -> float | None:
    """The link rate (GB/s) at which the model's plaintext ring all-reduce (ccddp's own
    engine without crypto) takes as long as ``ring`` was measured to; None when no rate
    can (the model's cores, not its link, already take longer).

    Streaming alone overstates what a collective gets: its buffers stay in cache and no
    send waits for a reduction. The ring is the same P2P traffic as the secure schedules,
    so its rate is the one they see.
    """
    from ccddp.sim.collective import secure_allreduce
    from ccddp.sim.rates import Rates
    from ccddp.sim.schedule import Schedule

    sched = Schedule("pipelined", segment_bytes=ring["segment_bytes"], chains=ring["chains"])
    target = ring["s"] * 1e3

    def model_ms(gbps: float) -> float:
        r = Rates.resolve(hw.replace(link_gbps=gbps), sched, n, True).without_crypto()
        return secure_allreduce(r, sched, n, ring["bytes"]).ms

    lo, hi = 1e-3, 1e3
    if not model_ms(hi) <= target <= model_ms(lo):
        return None
    for _ in range(80):                     # time falls as the rate rises: bisect in log
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if model_ms(mid) > target else (lo, mid)
    return round((lo * hi) ** 0.5, 4)


def fit_crypto_rate(hw, secure: dict, ring: dict, n: int) -> float | None:
    """The factor on the profile's seal/open rates at which the model's crypto core time
    in the pipelined secure all-reduce ``secure`` equals the CPU time it measured beyond
    the plaintext ring ``ring`` (same engine, same transfers, same size); None if the
    difference is not positive or no factor in [1e-3, 1e3] reaches it.

    A tight loop of seals on one buffer runs faster than the engine's crypto, which
    works on frames in flight while the peer's transfers copy through the same caches.
    """
    from ccddp.sim.collective import secure_allreduce
    from ccddp.sim.rates import Rates
    from ccddp.sim.schedule import Schedule

    soft = max(1.0, n / hw.host_cores) if hw.host_cores > 0 else 1.0
    target = (secure["cpu_s"] - ring["cpu_s"]) * 1e3
    if not target > 0:
        return None
    sched = Schedule("pipelined", segment_bytes=secure["segment_bytes"],
                     chains=secure["chains"])

    def crypto_cpu_ms(k: float) -> float:
        h = hw.replace(enc_gbps=hw.enc_gbps * k, dec_gbps=hw.dec_gbps * k)
        r = Rates.resolve(h, sched, n, True)
        on = secure_allreduce(r, sched, n, secure["bytes"]).busy_ms
        off = secure_allreduce(r.without_crypto(), sched, n, secure["bytes"]).busy_ms
        return (on - off) / soft

    lo, hi = 1e-3, 1e3
    if not crypto_cpu_ms(hi) <= target <= crypto_cpu_ms(lo):
        return None
    for _ in range(80):                     # crypto time falls as the rate rises
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if crypto_cpu_ms(mid) > target else (lo, mid)
    return (lo * hi) ** 0.5


def model_checks(hw, p2p: dict, fitted: dict | None = None) -> list[dict]:
    """The measured all-reduces beside what the model predicts for them: wall time, and
    core time (the model's busy time against the rank's CPU seconds). ``fitted`` maps
    ``(impl, bytes)`` to what a profile field was solved from (``"time"`` or ``"CPU"``),
    shown as each row's ``fitted``; every other number is a check."""
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
        out.append({**row, "fitted": (fitted or {}).get((impl, nbytes), ""),
                    "measured_ms": measured, "model_ms": c.ms,
                    "error": c.ms / measured - 1 if measured > 0 else None,
                    "measured_cpu_ms": row.get("cpu_s", 0.0) * 1e3,
                    "model_cpu_ms": c.busy_ms / soft})
    return out


def derive_profile(local: dict, p2p: dict, *, name: str = "local") -> dict:
    """Everything :func:`ccddp.bench.calibrate.calibrate` returns but the timing, from its
    measurements: the profile, its notes and header, the fitted values' alternatives, and
    the checks (re-run it on a saved ``calibrate --json``, on the machine it measured, to
    re-derive a profile).

    Order matters: the per-message cost, the engine's crypto rate and the link rate are
    each solved through the model with the others fixed; the crypto fit cancels the
    per-message cost (secure minus ring), so the per-message cost is solved again after it.
    """
    from ccddp.sim.profile import validate_profile

    n = int(p2p["world_size"])
    d, notes, header = build_profile(local, p2p, name=name)
    hw = validate_profile(d, source="calibrate")
    d["segment_overhead_us"] = fit_segment_overhead(hw, p2p["tiny"], n)
    hw = validate_profile(d, source="calibrate")
    stream_gbps = d["link_gbps"]
    ring = max((r for r in p2p["allreduce"] if r["impl"] == "ring"), key=lambda r: r["bytes"])
    secure = next(r for r in p2p["allreduce"]
                  if r["impl"] == "secure" and r["bytes"] == ring["bytes"])
    loop = (d["enc_gbps"], d["dec_gbps"])
    k = fit_crypto_rate(hw, secure, ring, n) if "cpu_s" in secure else None
    fitted: dict[tuple[str, int], str] = {}
    if k is not None:
        fitted["secure", secure["bytes"]] = "CPU"
        d["enc_gbps"], d["dec_gbps"] = round(loop[0] * k, 4), round(loop[1] * k, 4)
        d["cpu_crypto_gbps"] = d["enc_gbps"]
        where = (f"solved through the model from the CPU time ccddp's pipelined secure "
                 f"all-reduce of {secure['bytes'] // MIB} MiB on {n} local ranks takes "
                 f"beyond its plaintext ring (the engine's crypto as it runs; a tight loop "
                 f"of LinkChannel calls gave")
        notes["enc_gbps"] = f"MEASURED: {where} {loop[0]:g} GB/s)"
        notes["dec_gbps"] = f"MEASURED: {where} {loop[1]:g} GB/s; the loop's seal/open ratio)"
        hw = validate_profile(d, source="calibrate")
        d["segment_overhead_us"] = fit_segment_overhead(hw, p2p["tiny"], n)
        hw = validate_profile(d, source="calibrate")
    wall_us = fit_segment_overhead(hw, p2p["tiny"], n, quantity="wall")
    link = fit_link_rate(hw, ring, n)
    if link is not None:
        fitted["ring", ring["bytes"]] = "time"
        d["link_gbps"] = link
        notes["link_gbps"] = (f"MEASURED: solved through the model from ccddp's plaintext "
                              f"ring all-reduce of {ring['bytes'] // MIB} MiB on {n} local "
                              f"ranks (ring streaming alone gave {stream_gbps:g} GB/s: hot "
                              f"caches, no send waiting for a reduction)")
        hw = validate_profile(d, source="calibrate")
    return {"schema": SCHEMA, "world_size": n, "profile": d, "notes": notes, "header": header,
            "measurements": {"local": local, "p2p": p2p,
                             "segment_overhead_wall_fit_us": wall_us,
                             "link_gbps_streaming": stream_gbps,
                             "crypto_gbps_loop": {"seal": loop[0], "open": loop[1]}},
            "checks": model_checks(hw, p2p, fitted)}
