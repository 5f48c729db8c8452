"""``ccddp bench collectives``: nccl-tests style benchmark of every implementation."""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from ccddp.errors import ConfigError


def register(sub) -> None:
    from ccddp.bench.collectives import build_parser

    bench = sub.add_parser("bench", help="measure collectives")
    inner = bench.add_subparsers(dest="bench_command", required=True, metavar="WHAT")
    p = inner.add_parser("collectives", parents=[build_parser(add_help=False)],
                         help="time gloo / ring / secure-naive / secure collectives (nccl-tests table)")
    p.add_argument("--world-size", type=int, default=2, help="local ranks to launch")
    p.set_defaults(func=run)
    c = inner.add_parser("channel", help="secure channel seal/open vs raw AES-GCM on one thread")
    c.add_argument("--size", default="4M", help="buffer size (default 4M)")
    c.add_argument("--reps", type=int, default=40)
    c.add_argument("--json", default=None)
    c.set_defaults(func=run_channel)


def run(args: argparse.Namespace) -> int:
    from ccddp.bench.collectives import validate
    from ccddp.bench.launch import torchrun
    from ccddp.report.tables import collectives_table, print_table

    validate(args)
    if args.world_size < 2:
        raise ConfigError(f"--world-size must be >= 2 (a collective needs a peer), got {args.world_size}")
    with tempfile.TemporaryDirectory() as tmp:
        out = args.json or os.path.join(tmp, "result.json")
        forwarded = ["--sizes", args.sizes, "--impl", args.impl, "--ops", args.ops, "--dtype", args.dtype,
                     "--algorithm", args.algorithm, "--segment-mb", str(args.segment_mb), "--tag", args.tag,
                     "--chains", str(args.chains), "--allgather", args.allgather, "--iters", str(args.iters),
                     "--warmup", str(args.warmup), "--timeout", str(args.timeout), "--json", out]
        torchrun("ccddp.bench.collectives", forwarded, nproc=args.world_size)
        with open(out) as f:
            result = json.load(f)
    rows = result["rows"]
    print_table(collectives_table(rows, title=f"ccddp bench collectives, world size {args.world_size}"))
    if args.json:
        print(f"wrote {args.json}")
    return 1 if any(r["wrong"] for r in rows) else 0


def run_channel(args: argparse.Namespace) -> int:
    from ccddp.bench.channel import bench_channel
    from ccddp.bench.collectives import parse_size
    from ccddp.bench.machine import machine_info

    if args.reps < 1:
        raise ConfigError("--reps must be >= 1")
    r = bench_channel(parse_size(args.size), args.reps)
    g = r["gbps"]
    print(f"{r['bytes']} B, median of {r['reps']}: seal raw {g['raw_seal']:.2f} GB/s, channel {g['channel_seal']:.2f} "
          f"GB/s ({r['seal_ratio']:.0%}); open raw {g['raw_open']:.2f} GB/s, channel {g['channel_open']:.2f} GB/s "
          f"({r['open_ratio']:.0%})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"schema": "ccddp.bench.channel/1", "machine": machine_info(), **r}, f, indent=2)
    return 0
