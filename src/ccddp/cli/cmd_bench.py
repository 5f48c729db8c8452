"""``ccddp bench collectives``: nccl-tests style benchmark of every implementation;
``ccddp bench channel``: the secure channel against raw AES-GCM."""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from ccddp.errors import ConfigError


SUMMARY = "micro-benchmarks: secure collectives against gloo, the secure channel against raw AES-GCM"


def register(sub) -> None:
    from ccddp.bench.options import build_collectives_parser

    bench = sub.add_parser("bench", help=SUMMARY, description=SUMMARY)
    inner = bench.add_subparsers(dest="bench_command", required=True, metavar="WHAT")
    parent = build_collectives_parser(add_help=False)
    p = inner.add_parser("collectives", parents=[parent], description=parent.description,
                         help="time gloo / ring / secure-naive / secure collectives (nccl-tests table)")
    p.add_argument("--world-size", type=int, default=2, help="local ranks to launch (>= 2)")
    p.add_argument("--wide", action="store_true",
                   help="every column (operation, CPU time, seals and opens, tags, additive floor); by default "
                        "nccl-tests' columns and the paired ratio, within 120 columns")
    p.set_defaults(func=run)
    c = inner.add_parser("channel", help="secure channel seal/open vs raw AES-GCM on one thread; "
                                         "--device cuda: the GPU engine vs a device copy and OpenSSL")
    c.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the buffers live (default cpu)")
    c.add_argument("--engine", choices=("openssl", "triton"), default=None,
                   help="AES-GCM implementation (default: openssl on cpu, triton on cuda); triton on cpu runs "
                        "Triton's interpreter: a correctness check, not a speed")
    c.add_argument("--size", default=None, help="buffer size (default 4M; 64M on cuda; 64K for triton on cpu)")
    c.add_argument("--reps", type=int, default=None, help="timed repetitions (default 40; 20 on cuda)")
    c.add_argument("--json", default=None, metavar="PATH", help="write the results here as JSON")
    c.set_defaults(func=run_channel)


def collectives_start_line(args: argparse.Namespace) -> str:
    """What ``bench collectives`` is about to do, printed before anything slow starts."""
    sizes, impls, ops = args.sizes.split(","), args.impl.split(","), args.ops.split(",")
    return (f"ccddp bench collectives: {', '.join(impls)} in turns on {args.world_size} local ranks, "
            f"{', '.join(ops)} of {', '.join(sizes)}: {args.warmup} warm-up + {args.iters} measured calls each "
            f"({len(impls) * len(ops) * len(sizes) * (args.warmup + args.iters)} calls); timing this machine's "
            "AES-GCM first, then starting the ranks")


def run(args: argparse.Namespace) -> int:
    from ccddp.bench.options import check_collectives

    # Every argument before torch loads: a mistake is answered at once.
    if args.world_size < 2:
        raise ConfigError(f"--world-size must be >= 2 (a collective needs a peer), got {args.world_size}")
    check_collectives(args)
    from ccddp.cli.preflight import check_group_secret, require_gpu_device, warn_oversubscribed

    check_group_secret()
    if args.device == "cuda":
        require_gpu_device("ccddp bench collectives")   # no GPU device at all: answered before torch loads
    else:
        warn_oversubscribed(args.world_size, "ccddp bench collectives")
    if args.device == "cuda":
        from ccddp.bench.devices import require_cuda  # torch: after every argument is checked

        require_cuda("ccddp bench collectives")
    print(collectives_start_line(args), flush=True)
    from ccddp.bench.collectives import validate
    from ccddp.bench.launch import torchrun
    from ccddp.bench.machine import aes_gcm_rate
    from ccddp.report.tables import add_additive_floor, print_collectives

    validate(args)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        forwarded = ["--sizes", args.sizes, "--impl", args.impl, "--ops", args.ops, "--dtype", args.dtype,
                     "--algorithm", args.algorithm, "--segment-mb", str(args.segment_mb), "--tag", args.tag,
                     "--chains", str(args.chains), "--allgather", args.allgather,
                     "--trust-domains", args.trust_domains, "--device", args.device,
                     "--placement", args.placement, "--iters", str(args.iters),
                     "--warmup", str(args.warmup), "--timeout", str(args.timeout), "--json", out]
        # The AES-GCM rate of the floor, measured in this run (before the ranks start, so
        # the measuring thread has a core to itself), and again after them: the rate
        # used is the mean, and both are recorded.
        before = aes_gcm_rate()
        torchrun("ccddp.bench.collectives", forwarded, nproc=args.world_size)
        after = aes_gcm_rate()
        with open(out) as f:
            result = json.load(f)
    aes = {**before, "seal_gbps": (before["seal_gbps"] + after["seal_gbps"]) / 2,
           "open_gbps": (before["open_gbps"] + after["open_gbps"]) / 2, "before": before, "after": after}
    rows = result["rows"]
    ref = rows[0]["impl"] if rows else "gloo"
    # The floor adds the host's AES-GCM time: a bound only where the host seals (CPU
    # tensors, or CUDA tensors staged through host memory), not for the device engine.
    if args.device == "cpu" or args.placement == "staged":
        add_additive_floor(rows, aes, ref)
    result["aes_gcm_rate"] = aes
    on = "" if args.device == "cpu" else f", CUDA tensors (placement {args.placement})"
    print_collectives(rows, title=f"ccddp bench collectives, world size {args.world_size}{on}", aes=aes,
                      wide=args.wide)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.json}")
    return 1 if any(r["wrong"] for r in rows) else 0


#: What ``bench channel --device cuda`` prints where there is no CUDA device (exit 0: the
#: GPU check's dry run passes on it).
NO_CUDA_DEVICE = "ccddp bench channel --device cuda: no CUDA device here; nothing measured"


def run_channel(args: argparse.Namespace) -> int:
    from ccddp.bench.options import parse_size

    engine = args.engine or ("triton" if args.device == "cuda" else "openssl")
    if args.device == "cuda" and engine == "openssl":
        raise ConfigError("OpenSSL cannot seal device memory: use --engine triton with --device cuda")
    if args.reps is not None and args.reps < 1:
        raise ConfigError("--reps must be >= 1")
    if args.device == "cuda":
        nbytes = parse_size(args.size or "64M")      # a mistake is one line before torch loads
        from ccddp.cli.preflight import gpu_device_files

        if not gpu_device_files():                   # no GPU device file: said without loading torch
            print(NO_CUDA_DEVICE)
            return 0
        return _run_channel_cuda(nbytes, args.reps or 20, args.json)
    if engine == "triton":
        return _check_channel_interpreted(parse_size(args.size or "64K"), args.json)
    return _run_channel_host(parse_size(args.size or "4M"), args.reps or 40, args.json)


def _write(path: str | None, schema: str, result: dict) -> None:
    from ccddp.bench.machine import machine_info

    if path:
        with open(path, "w") as f:
            json.dump({"schema": schema, "machine": machine_info(), **result}, f, indent=2)
        print(f"wrote {path}")


def _run_channel_host(nbytes: int, reps: int, path: str | None) -> int:
    from ccddp.bench.channel import bench_channel

    r = bench_channel(nbytes, reps)
    g = r["gbps"]
    print(f"{r['bytes']} B, median of {r['reps']}: seal raw {g['raw_seal']:.2f} GB/s, channel {g['channel_seal']:.2f} "
          f"GB/s; open raw {g['raw_open']:.2f} GB/s, channel {g['channel_open']:.2f} GB/s")
    print(f"channel / raw rate, paired per repetition (95 % interval): seal {channel_ratio_text(r['seal_ratio_interval'])}; "
          f"open {channel_ratio_text(r['open_ratio_interval'])}")
    _write(path, "ccddp.bench.channel/1", r)
    return 0


def channel_ratio_text(iv: list) -> str:
    """``[estimate, low, high, n]`` as every ratio is printed (:func:`ccddp.stats.ratio_text`):
    ``0.83× (0.80–0.86)``, ``no measurable difference (0.91–1.04)``, or the estimate with
    ``(n=3, no interval)``."""
    from ccddp.stats import Interval, ratio_text

    if iv[0] is None:
        return "not measured"
    return ratio_text(Interval(*iv))


def _run_channel_cuda(nbytes: int, reps: int, path: str | None) -> int:
    import torch

    from ccddp.bench.channel import bench_device

    if not torch.cuda.is_available():
        print(NO_CUDA_DEVICE)
        return 0
    r = bench_device(nbytes, reps, "cuda")
    r["gpu"] = torch.cuda.get_device_name()
    print(f"{r['gpu']}, {r['bytes']} B, median (min-max) GB/s of {r['reps']}, "
          f"every frame checked against OpenSSL ({r['checked_frames']}):")
    for name, row in r["rows"].items():
        print(f"  {name:13s} {row['gbps']:9.2f} ({row['gbps_min']:.2f}-{row['gbps_max']:.2f})  "
              f"{row['vs_copy']:6.3f}x copy")
    _write(path, "ccddp.bench.channel-device/1", r)
    return 0


def _check_channel_interpreted(nbytes: int, path: str | None) -> int:
    from ccddp.bench.channel import bench_device

    r = bench_device(nbytes, 1, "cpu")
    r["label"] = "correctness-only: Triton's interpreter on the CPU; its times are not a speed of anything"
    print(f"correctness-only (Triton interpreter on CPU, not a speed): {r['bytes']} B sealed and opened with and "
          f"without pads, {r['checked_frames']} frames identical to OpenSSL's")
    _write(path, "ccddp.bench.channel-device/1", r)
    return 0
