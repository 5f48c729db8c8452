"""From ``ccddp calibrate``'s measurements to a hardware profile.

:func:`derive_profile` takes the measurement dicts :mod:`ccddp.bench.calibrate` collects
(or a saved ``ccddp calibrate --json`` file's ``measurements``) and returns the profile
(every field a :class:`~ccddp.sim.profile.FieldValue`: value, source, note, standard
error where a fit gives one), the header, and the model's predictions beside the
measured all-reduces. Arithmetic only, but for this machine's core count, CPU description
and launch settings, which it reads (so re-derive a saved calibration on the machine it
was measured on). Rates come straight from the micro-benchmarks where they can; the
per-message cost, the engine's in-flight AES-GCM rate and the link rate a collective sees
are solved through the model itself (:func:`ccddp.sim.solve.root`), so the model fed this
profile reproduces the micro-benchmarks they came from.

The crypto's fixed and per-byte costs are fitted separately from a sweep of sizes
(:func:`crypto_lines`); the same row format from a device's sweep (``bytes``,
``seal_s``, ``open_s``; chains as ``chains``, ``gbps``) fills the same fields for a GPU
profile (:func:`crypto_records`).

Example::

    import json
    from ccddp.sim.profile import write_profile

    saved = json.load(open("calibrate.json"))["measurements"]
    result = derive_profile(saved["local"], saved["p2p"])
    write_profile(result["profile"], "local.toml", header=result["header"])
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ccddp.sim.profile import FieldValue, Source
from ccddp.sim.solve import root

SCHEMA = "ccddp.calibrate/2"
KIB, MIB = 1 << 10, 1 << 20


def M(value: Any, note: str, stderr: float | None = None) -> FieldValue:
    """A value measured on this machine."""
    return FieldValue(value, Source.MEASURED, note, stderr)


def D(value: Any, note: str) -> FieldValue:
    """A value that follows from the machine's structure."""
    return FieldValue(value, Source.DERIVED, note)


def A(value: Any, note: str) -> FieldValue:
    """A value nothing here measures."""
    return FieldValue(value, Source.ASSUMED, note)


@dataclass(frozen=True)
class LineFit:
    """``y = intercept + slope * x`` with one standard error each."""

    intercept: float
    slope: float
    intercept_se: float
    slope_se: float


def fit_line(xs: list[float], ys: list[float]) -> LineFit:
    """Weighted least squares ``y = a + b x`` with standard errors; ``a`` clipped at 0.

    Weights 1/y: the small sizes (which fix the intercept) count as much as the big ones
    (which fix the slope), so relative, not absolute, error is minimised. The standard
    errors come from the residual scatter (``(A^T W A)^-1 s^2``); with two points there
    is no scatter to estimate them from, and they are 0.
    """
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    w = 1.0 / y
    A = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    coef, *_ = np.linalg.lstsq(A, y * w, rcond=None)
    a, b = float(coef[0]), float(coef[1])
    dof = len(x) - 2
    se_a = se_b = 0.0
    if dof > 0:
        resid = y * w - A @ coef
        cov = np.linalg.inv(A.T @ A) * float(resid @ resid) / dof
        se_a, se_b = float(math.sqrt(max(cov[0, 0], 0))), float(math.sqrt(max(cov[1, 1], 0)))
    return LineFit(max(0.0, a), b, se_a, se_b)


def crypto_lines(rows: list[dict]) -> dict[str, float]:
    """Per-call cost (us) and per-byte rate (GB/s) of seal and open, each with its
    standard error, from a sweep of sizes (rows: ``bytes``, ``seal_s``, ``open_s``)."""
    out: dict[str, float] = {}
    xs = [r["bytes"] for r in rows]
    for op in ("seal", "open"):
        f = fit_line(xs, [r[f"{op}_s"] for r in rows])
        gbps = 1 / f.slope / 1e9
        out[f"{op}_fixed_us"] = f.intercept * 1e6
        out[f"{op}_fixed_us_se"] = f.intercept_se * 1e6
        out[f"{op}_gbps"] = gbps
        out[f"{op}_gbps_se"] = gbps * f.slope_se / f.slope
    return out


def crypto_records(lines: dict[str, float], sizes: list[int], chains: dict | None, *,
                   how: str, soft: float = 1.0,
                   chains_are_threads: bool = True) -> dict[str, FieldValue]:
    """The crypto fields of a profile from a fitted sweep (``lines``: :func:`crypto_lines`;
    ``sizes``: the sweep's message sizes; ``chains``: the chain sweep, rows of ``chains``
    and ``gbps``). ``soft``: the model's own contention factor at the measured ranks,
    divided out (rates measured with every rank busy). Serves a CPU calibration and,
    fed a device's sweep in the same format (``chains_are_threads=False``: a GPU's chains
    are GHASH chains beside a device-wide CTR), a GPU one."""
    seal_fixed, open_fixed = lines["seal_fixed_us"] / soft, lines["open_fixed_us"] / soft
    fixed_se = math.hypot(lines["seal_fixed_us_se"], lines["open_fixed_us_se"]) / 2 / soft
    sweep = ", ".join(f"{s // KIB} KiB" for s in sizes)
    rec = {
        "enc_gbps": M(round(lines["seal_gbps"] * soft, 4),
                      f"slope of the seal time over {sweep}, {how}",
                      round(lines["seal_gbps_se"] * soft, 4)),
        "dec_gbps": M(round(lines["open_gbps"] * soft, 4),
                      f"slope of the open time over the same sizes, {how}",
                      round(lines["open_gbps_se"] * soft, 4)),
        "crypto_op_us": M(round((seal_fixed + open_fixed) / 2, 3),
                          f"intercept of the seal and open lines (AAD, nonce, call; seal "
                          f"{seal_fixed:.2f}, open {open_fixed:.2f} us), {how}",
                          round(fixed_se, 3)),
        "envelope_min_bytes": M(float(min(sizes)), "smallest size of the seal/open sweep"),
    }
    if chains:
        rows = chains["rows"]
        top = max(r["chains"] for r in rows)
        scaling = rows[-1]["gbps"] / rows[0]["gbps"]
        rates = ", ".join(f"{r['chains']}: {r['gbps']:.2f}" for r in rows)
        rec["envelope_chains"] = M(top, f"most threads of the chain sweep sealing at once "
                                   f"(chains: GB/s {rates})")
        if chains_are_threads:
            rec["chains_scale_enc"] = D(True, f"chains are threads running whole AES-GCM; "
                                        f"{top} at once seal {scaling:.2f}x one")
    return rec


def device_records(results: list[dict], *, device: str = "cuda",
                   staging: list[dict] | None = None) -> dict[str, FieldValue]:
    """The profile fields a device sweep measures, and only those (every one MEASURED).

    ``results``: ``ccddp bench channel --device cuda --json`` results at two or more
    ``--size`` values (each gives the engine's seal and open time at one size; the sizes
    give the line): the crypto fields :func:`crypto_records` fills, ``envelope_max_bytes``,
    ``xor_gbps`` from the pre-computed-pad seals where the runs have them, and
    ``cpu_crypto_gbps`` from the OpenSSL seals on the same machine's host where they have
    those. ``staging``: rows of ``bytes``, ``d2h_s``, ``h2d_s`` (pinned copies, see
    :func:`staging_records`) for the staging fields."""
    from ccddp.errors import ConfigError

    rows = sorted(({"bytes": int(r["bytes"]), "seal_s": float(r["rows"]["seal"]["median_s"]),
                    "open_s": float(r["rows"]["open"]["median_s"])} for r in results),
                  key=lambda r: r["bytes"])
    sizes = sorted({r["bytes"] for r in rows})
    if len(sizes) < 2:
        raise ConfigError("a device sweep needs results at two or more sizes "
                          "(ccddp bench channel --device cuda --size S --json ...)")
    how = f"the {device} engine (ccddp bench channel --device {device})"
    d = crypto_records(crypto_lines(rows), sizes, None, how=how, chains_are_threads=False)
    d["envelope_max_bytes"] = M(float(max(sizes)), f"largest size of the {device} sweep")
    pads = [r for r in results if "seal_pad" in r.get("rows", {})]
    if pads:
        big = max(pads, key=lambda r: r["bytes"])
        d["xor_gbps"] = M(round(float(big["rows"]["seal_pad"]["gbps"]), 3),
                          f"seal with a pre-computed pad, {big['bytes'] // MIB} MiB, {how}")
    host = [{"bytes": int(r["bytes"]), "seal_s": float(r["rows"]["openssl_seal"]["median_s"]),
             "open_s": float(r["rows"]["openssl_open"]["median_s"])}
            for r in results if {"openssl_seal", "openssl_open"} <= set(r.get("rows", {}))]
    if len({r["bytes"] for r in host}) >= 2:
        lines = crypto_lines(host)
        d["cpu_crypto_gbps"] = M(round(lines["seal_gbps"], 4), "slope of OpenSSL's seal time on one "
                                 f"host core of the {device} machine, in the same sweep",
                                 round(lines["seal_gbps_se"], 4))
    if staging:
        d.update(staging_records(staging, device=device))
    return d


def staging_records(rows: list[dict], *, device: str = "cuda") -> dict[str, FieldValue]:
    """``staging_d2h_gbps``, ``staging_h2d_gbps`` and ``staging_copy_us`` from a sweep of
    pinned copies (rows: ``bytes``, ``d2h_s`` device -> pinned host, ``h2d_s`` pinned host
    -> device, each timed from enqueue to the wait for it): the slope of each line is its
    rate, the mean of their intercepts the fixed cost of one copy."""
    from ccddp.errors import ConfigError

    sizes = sorted({int(r["bytes"]) for r in rows})
    if len(sizes) < 2:
        raise ConfigError("a staging sweep needs copies at two or more sizes")
    xs = [r["bytes"] for r in rows]
    d2h, h2d = fit_line(xs, [r["d2h_s"] for r in rows]), fit_line(xs, [r["h2d_s"] for r in rows])
    sweep = f"pinned copies of {', '.join(f'{s // KIB} KiB' for s in sizes)} on {device}"

    def rate(f: LineFit, what: str) -> FieldValue:
        gbps = 1 / f.slope / 1e9
        return M(round(gbps, 4), f"slope of the {what} copy time over {sweep}",
                 round(gbps * f.slope_se / f.slope, 4))

    return {"staging_d2h_gbps": rate(d2h, "device -> pinned host"),
            "staging_h2d_gbps": rate(h2d, "pinned host -> device"),
            "staging_copy_us": M(round((d2h.intercept + h2d.intercept) / 2 * 1e6, 3),
                                 f"mean intercept of the two copy lines (device -> host "
                                 f"{d2h.intercept * 1e6:.2f}, host -> device {h2d.intercept * 1e6:.2f} "
                                 f"us: enqueue and wait), {sweep}",
                                 round(math.hypot(d2h.intercept_se, h2d.intercept_se) / 2 * 1e6, 3))}


def device_profile(base, results: list[dict], *, device: str = "cuda",
                   staging: list[dict] | None = None) -> dict:
    """A device profile's records with what a device sweep measures (:func:`device_records`)
    replacing ``base``'s (a profile); every other field is ``base``'s."""
    d = base.as_records()
    d.update(device_records(results, device=device, staging=staging))
    return d


def _launch_threads() -> int:
    """Compute threads of one rank as ``ccddp`` launches ranks (OMP_NUM_THREADS)."""
    from ccddp.bench.launch import job_env

    try:
        return max(1, int(job_env().get("OMP_NUM_THREADS", "1")))
    except ValueError:
        return 1


def build_profile(local: dict, p2p: dict, *, name: str = "local") -> tuple[dict, list]:
    """(profile records, header lines) from the measurements. The segment overhead is
    left for :func:`fit_segment_overhead`, which needs the rest of the profile."""
    from ccddp.bench.machine import _cpu_model, cpu_details

    cores = os.cpu_count() or 1
    n = int(p2p["world_size"])
    # Rates measured with every rank busy at once; the model's own contention factor
    # for n ranks on these cores is divided out (1 while ranks <= cores).
    conc = p2p.get("concurrent")
    soft = max(1.0, n / cores)          # the model's contention factor for one-thread work
    if conc:
        lines = conc
        torch_r = {k: conc[k] * soft for k in local["torch"]}
        how = f"one thread per rank, {n} ranks at once"
    else:
        lines = local["crypto"]
        torch_r = local["torch"]
        how = "one thread"
    stream = p2p["stream"]
    link = fit_line([r["bytes"] for r in stream], [r["s"] for r in stream])
    link_gbps = soft / link.slope / 1e9
    # Core time per byte sent, from the largest messages (per-message costs amortised):
    # CPU seconds are not stretched by contention, so no correction for the ranks.
    big = [r for r in stream if r["bytes"] >= MIB] or stream
    link_cpu_gbps = sum(r["bytes"] for r in big) / sum(r["cpu_s"] for r in big) / 1e9
    inter = p2p.get("interference")
    threads = _launch_threads()
    sizes = [r["bytes"] for r in local["crypto"]["rows"]]
    crypto = crypto_records(lines, sizes, local.get("crypto_chains"), how=how,
                            soft=soft if conc else 1.0)
    top_ar = max((r["bytes"] for r in p2p.get("allreduce", [])), default=4 * MIB)
    d: dict[str, Any] = {
        "name": name,
        "description": f"{_cpu_model()}, {cores} cores shared by every rank, gloo loopback, "
                       "AES-256-GCM via cryptography (calibrated)",
        "gpus_per_node": D(64, "every rank runs on this one host"),
        "compute_tflops": M(round(torch_r["matmul_tflops"], 5), f"fp32 matmul, {how} (used "
                            "only for workloads without measured phase times)"),
        "backward_ratio": A(2.0, "backward ~2x forward (only without measured times)"),
        "optimizer_gbps": M(round(torch_r["sgd_gbps"], 4), f"torch.optim.SGD step, {how}"),
        "kernel_launch_us": D(0.0, "no accelerator, no kernel launches"),
        "cc_launch_toll": D(1.0, "no CC hardware"),
        "link_gbps": M(round(link_gbps, 4), f"gloo isend/irecv ring streaming (messages in "
                       f"flight) on {n} local ranks, slope of a line through {len(stream)} "
                       "sizes" + (f", times the model's {soft:g}x contention at {n} ranks"
                                  if soft > 1 else "")),
        "link_latency_us": M(round(p2p["rtt_us"] / 2, 2), "half the gloo ping-pong round "
                             "trip of 16 B"),
        "nvls": D(False, "no switch reduction on a CPU host"),
        "reduce_gbps": M(round(torch_r["reduce_gbps"], 4), f"torch add_ of fp32 tensors, {how}"),
        "segment_overhead_us": M(0.0, "solved below"),
        "op_fixed_us": A(0.0, "solved below from a paired small all-reduce, where measured"),
        "link_cpu_gbps": M(round(link_cpu_gbps, 4), "bytes sent per CPU-second of a rank (all "
                           "its threads, user + system) during the ring streaming, messages "
                           ">= 1 MiB"),
        "cc_exchange_toll_us": D(0.0, "no CC hardware"),
        "cc_bandwidth_kept": D(1.0, "no CC hardware"),
        "device_link": D("untrusted", "loopback runs through host memory the host controls: "
                         "ccddp seals every hop"),
        "cc_nvls": D(False, "no switch on a CPU host"),
        "mac_gbps": D(float("inf"), "OpenSSL stitches GHASH into the AES-GCM rates"),
        "mac_chains": D(0, "ccddp's automatic rule: the host's cores shared by the ranks on it"),
        "max_chains": D(cores, "cores of the host"),
        "chains_scale_enc": D(True, "chains are threads running whole AES-GCM"),
        "op_bucket_share": D(0.0, "ccddp's engines seal what they send"),
        "tag_us": D(0.0, "the tag is part of each call, already in crypto_op_us"),
        "tag_bytes": D(16.0, "the 16-byte GCM tag ccddp sends"),
        "xor_gbps": M(round(torch_r["xor_gbps"], 4), f"numpy XOR, {how} (pads: model only)"),
        "envelope_chains": D(1, "no chain sweep"),
        "envelope_max_bytes": M(float(max(max(sizes), top_ar)), "largest all-reduce of the "
                                "calibration"),
        "pcie_gbps": M(round(torch_r["memcpy_gbps"], 4), f"torch clone of 4 MiB (the CC-off "
                       f"staging copy of a batch), {how}"),
        "cc_pcie_kept": D(1.0, "no CC bounce hardware"),
        "cpu_crypto_gbps": M(crypto["enc_gbps"].value, "as enc_gbps (the bounce path seals on "
                             "the CPU)", crypto["enc_gbps"].stderr),
        "cpu_crypto_threads": D(cores, "cores of the host"),
        "bounce_threads": D(1, "ccddp seals a batch on the training thread"),
        "bounce_pipelined": D(False, "ccddp seals, copies and opens one after another"),
        "input_path_shared": D(False, "each rank makes its own batch"),
        "staging_d2h_gbps": D(round(torch_r["memcpy_gbps"], 4), "no accelerator: staging is a host "
                              f"memory copy, as pcie_gbps ({how})"),
        "staging_h2d_gbps": D(round(torch_r["memcpy_gbps"], 4), "no accelerator: staging is a host "
                              f"memory copy, as pcie_gbps ({how})"),
        "staging_copy_us": D(0.0, "no accelerator: no copy to enqueue or wait for"),
        "inter_node_gbps": A(1.25, "10 GbE, unused on one host"),
        "inter_node_latency_us": A(50.0, "unused on one host"),
        "host_cores": M(cores, "os.cpu_count()"),
        "compute_threads": D(threads, "OMP_NUM_THREADS of ranks ccddp launches"),
        "overlap_efficiency": D(0.0, "the comm thread and backward share the same cores"),
        "interference": A(0.0, "not measured"),
        **crypto,
    }
    if inter:
        # Measured at n ranks; the model scales it by the compute threads per core.
        per_core = max(1.0, n * threads / cores)
        d["interference"] = M(round(max(0.0, inter["excess"]) / per_core, 4),
                              f"conv forward+backward and AES-GCM on two threads of each of "
                              f"{n} ranks at once, against the sum of each alone "
                              f"(+{inter['excess']:.1%} at {n} ranks)")
    cpu = cpu_details()
    header = [f"{name}: calibrated by `ccddp calibrate` on {_cpu_model()} ({cores} cores), "
              f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}.",
              # The CPU model name does not say which AES-GCM code path OpenSSL takes.
              f"CPU family {cpu['cpu_family']} model {cpu['cpu_model_number']}, AES-related "
              f"flags: {' '.join(cpu['aes_flags']) or 'none'}; {cpu['openssl']}.",
              "measured: from this machine's micro-benchmarks (never from training runs); "
              "derived: from the machine's structure; assumed: nothing here measures it."]
    return d, header


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

    def excess(us: float) -> float:
        h = hw.replace(segment_overhead_us=us)
        c = secure_allreduce(Rates.resolve(h, sched, n, True), sched, n, tiny["bytes"])
        return (c.busy_ms if quantity == "cpu" else c.ms) - target

    if excess(0.0) >= 0:
        return 0.0
    us = root(excess, 0.0, 1e6)
    return round(us, 2) if us is not None else 1e6


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

    def excess(gbps: float) -> float:
        r = Rates.resolve(hw.replace(link_gbps=gbps), sched, n, True).without_crypto()
        return secure_allreduce(r, sched, n, ring["bytes"]).ms - target

    x = root(excess, 1e-3, 1e3, log=True)
    return None if x is None else round(x, 4)


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

    def excess(k: float) -> float:
        h = hw.replace(enc_gbps=hw.enc_gbps * k, dec_gbps=hw.dec_gbps * k)
        r = Rates.resolve(h, sched, n, True)
        on = secure_allreduce(r, sched, n, secure["bytes"]).busy_ms
        off = secure_allreduce(r.without_crypto(), sched, n, secure["bytes"]).busy_ms
        return (on - off) / soft - target

    return root(excess, 1e-3, 1e3, log=True)


def fit_op_fixed(hw, small: dict, n: int) -> float:
    """The sealed call's fixed cost (us, ``op_fixed_us``) from ``small``: a paired small
    all-reduce, ccddp's pipelined engine against gloo's (``secure_s``, ``gloo_s``): what
    the sealed call costs beyond gloo's less what the model's seals, tags and messages
    already explain (its secure minus plaintext all-reduce of that size, with
    ``op_fixed_us`` 0), per rank (divided by the model's slow-down of a rank's software
    where ranks outnumber the host's cores); 0 where the model explains it all."""
    from ccddp.sim.collective import plain_allreduce, secure_allreduce
    from ccddp.sim.rates import Rates
    from ccddp.sim.schedule import Schedule

    sched = Schedule("pipelined", segment_bytes=small["segment_bytes"], chains=small["chains"])
    h = hw.replace(op_fixed_us=0.0)
    model = (secure_allreduce(Rates.resolve(h, sched, n, True), sched, n, small["bytes"]).ms
             - plain_allreduce(Rates.resolve(h, sched, n, False), n, small["bytes"],
                               False).ms)
    measured = (small["secure_s"] - small["gloo_s"]) * 1e3
    soft = max(1.0, min(n, hw.gpus_per_node) / hw.host_cores) if hw.host_cores > 0 else 1.0
    return round(max(0.0, measured - model) * 1e3 / soft, 2)


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
    measurements: the profile records and header, the fitted values' alternatives, and
    the checks (re-run it on a saved ``calibrate --json``, on the machine it measured, to
    re-derive a profile).

    Order matters: the per-message cost, the engine's crypto rate and the link rate are
    each solved through the model with the others fixed; the crypto fit cancels the
    per-message cost (secure minus ring), so the per-message cost is solved again after it.
    """
    from ccddp.sim.profile import validate_profile

    n = int(p2p["world_size"])
    d, header = build_profile(local, p2p, name=name)

    def solve_segment() -> None:
        us = fit_segment_overhead(validate_profile(d, source="calibrate"), p2p["tiny"], n)
        d["segment_overhead_us"] = M(us, "solved through the model from the CPU time of a "
                                     "secure all-reduce of many 4 KiB segments (its wall "
                                     "time gives a larger value, in ccddp calibrate --json: "
                                     "wake-ups)")

    solve_segment()
    stream_gbps = d["link_gbps"].value
    ring = max((r for r in p2p["allreduce"] if r["impl"] == "ring"), key=lambda r: r["bytes"])
    secure = next(r for r in p2p["allreduce"]
                  if r["impl"] == "secure" and r["bytes"] == ring["bytes"])
    loop = (d["enc_gbps"].value, d["dec_gbps"].value)
    hw = validate_profile(d, source="calibrate")
    k = fit_crypto_rate(hw, secure, ring, n) if "cpu_s" in secure else None
    fitted: dict[tuple[str, int], str] = {}
    if k is not None:
        fitted["secure", secure["bytes"]] = "CPU"
        where = (f"solved through the model from the CPU time ccddp's pipelined secure "
                 f"all-reduce of {secure['bytes'] // MIB} MiB on {n} local ranks takes "
                 f"beyond its plaintext ring (the engine's crypto as it runs; the sweep's "
                 f"slope gave")
        se = [d[f].stderr for f in ("enc_gbps", "dec_gbps")]
        d["enc_gbps"] = M(round(loop[0] * k, 4), f"{where} {loop[0]:g} GB/s)",
                          None if se[0] is None else round(se[0] * k, 4))
        d["dec_gbps"] = M(round(loop[1] * k, 4), f"{where} {loop[1]:g} GB/s; the sweep's "
                          "seal/open ratio)", None if se[1] is None else round(se[1] * k, 4))
        d["cpu_crypto_gbps"] = M(d["enc_gbps"].value, "as enc_gbps (the bounce path seals "
                                 "on the CPU)", d["enc_gbps"].stderr)
        solve_segment()
    hw = validate_profile(d, source="calibrate")
    small = p2p.get("small")
    if small:
        d["op_fixed_us"] = M(fit_op_fixed(hw, small, n), f"a {small['bytes'] // KIB} KiB "
                             f"all-reduce on {n} local ranks, the pipelined engine "
                             f"{small['secure_s'] * 1e6:.0f} us against gloo's "
                             f"{small['gloo_s'] * 1e6:.0f} us ({small['pairs']} paired calls, "
                             "medians), less the model's own secure-minus-plaintext at that "
                             "size: the sealed call's fixed software cost")
        hw = validate_profile(d, source="calibrate")
    else:
        d["op_fixed_us"] = A(0.0, "not measured: these measurements have no paired small "
                             "all-reduce (saved before calibrate measured it)")
    wall_us = fit_segment_overhead(hw, p2p["tiny"], n, quantity="wall")
    link = fit_link_rate(hw, ring, n)
    if link is not None:
        fitted["ring", ring["bytes"]] = "time"
        d["link_gbps"] = M(link, f"solved through the model from ccddp's plaintext ring "
                           f"all-reduce of {ring['bytes'] // MIB} MiB on {n} local ranks "
                           f"(ring streaming alone gave {stream_gbps:g} GB/s: hot caches, "
                           "no send waiting for a reduction)")
        hw = validate_profile(d, source="calibrate")
    return {"schema": SCHEMA, "world_size": n, "profile": d, "header": header,
            "measurements": {"local": local, "p2p": p2p,
                             "segment_overhead_wall_fit_us": wall_us,
                             "link_gbps_streaming": stream_gbps,
                             "crypto_gbps_loop": {"seal": loop[0], "open": loop[1]}},
            "checks": model_checks(hw, p2p, fitted)}


def records_json(d: dict) -> dict:
    """The profile records as JSON-ready dicts (``{value, source, note, stderr}``)."""
    return {k: (v.as_dict() if isinstance(v, FieldValue) else v) for k, v in d.items()}


__all__ = ["SCHEMA", "LineFit", "fit_line", "crypto_lines", "crypto_records", "device_records",
           "staging_records", "device_profile",
           "build_profile",
           "fit_segment_overhead", "fit_link_rate", "fit_crypto_rate", "fit_op_fixed",
           "model_checks",
           "derive_profile", "records_json"]
