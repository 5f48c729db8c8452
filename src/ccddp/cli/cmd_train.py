"""``ccddp train``: DDP training CC-off or CC-on, launched through torchrun."""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from ccddp.crypto.keys import ENV_SECRET, ENV_SECRET_FILE
from ccddp.errors import ConfigError


def register(sub) -> None:
    from ccddp.bench.train import build_parser

    p = sub.add_parser("train", parents=[build_parser(add_help=False)],
                       help="train a workload CC-off or CC-on and time every phase")
    p.add_argument("--world-size", type=int, default=2, help="local ranks to launch (per node)")
    p.add_argument("--nnodes", type=int, default=1, help="torchrun --nnodes (run one ccddp train per node)")
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-port", type=int, default=None, help="rendezvous port (needed with --nnodes > 1)")
    p.set_defaults(func=run)


def forwarded_args(args: argparse.Namespace, json_path: str) -> list[str]:
    out = ["--workload", args.workload, "--size", args.size, "--cc", args.cc, "--schedule", args.schedule,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--seed", str(args.seed), "--lr", str(args.lr),
           "--segment-mb", str(args.segment_mb), "--chains", str(args.chains), "--tag", args.tag,
           "--timeout", str(args.timeout), "--json", json_path]
    for flag, value in (("--batch-size", args.batch_size), ("--seq-len", args.seq_len),
                        ("--image-size", args.image_size), ("--dtype", args.dtype),
                        ("--bucket-cap-mb", args.bucket_cap_mb)):
        if value is not None:
            out += [flag, str(value)]
    return out


def check_request(args: argparse.Namespace) -> None:
    """Fail before launching anything when the request cannot work here."""
    from ccddp.bench.train import workload_from
    from ccddp.bench.memory import check_fits

    if args.world_size < 1 or args.nnodes < 1:
        raise ConfigError("--world-size and --nnodes must be >= 1")
    if args.cc == "on" and args.world_size * args.nnodes < 2:
        raise ConfigError("CC-on training needs at least 2 ranks: use --world-size 2 or more")
    if args.steps < 1 or args.warmup < 0:
        raise ConfigError("--steps must be >= 1 and --warmup >= 0")
    if args.nnodes > 1 and args.master_port is None:
        raise ConfigError("with --nnodes > 1 give every node the same --master-port")
    if args.nnodes > 1 and args.cc == "on" and not (os.environ.get(ENV_SECRET) or os.environ.get(ENV_SECRET_FILE)):
        raise ConfigError(f"with --nnodes > 1 every node needs the same group secret: set {ENV_SECRET} "
                          f"or {ENV_SECRET_FILE} on each node")
    check_fits(workload_from(args), args.world_size, args.world_size * args.nnodes,
               args.schedule if args.cc == "on" else None)


def run(args: argparse.Namespace) -> int:
    from ccddp.bench.launch import torchrun

    check_request(args)
    with tempfile.TemporaryDirectory() as tmp:
        out = args.json or os.path.join(tmp, "train.json")
        torchrun("ccddp.bench.train", forwarded_args(args, out), nproc=args.world_size, nnodes=args.nnodes,
                 node_rank=args.node_rank, master_port=args.master_port, timeout_s=args.timeout * 4 + 600)
        if args.node_rank == 0 and os.path.exists(out):
            with open(out) as f:
                result = json.load(f)
            print_summary(result)
    if args.json and args.node_rank == 0:
        print(f"wrote {args.json}")
    return 0


def print_summary(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from ccddp.bench.train import PHASES

    t = Table(title=f"{result['workload']} cc={result['cc']} world size {result['world_size']}"
                    + (f" schedule {result['schedule']}" if result["schedule"] else ""))
    t.add_column("step", justify="right")
    for col in ("total_ms",) + PHASES + ("crypto_busy_ms",):
        t.add_column(col.removesuffix("_ms").replace("_", " ") + " (ms)", justify="right")
    for it in result["iterations"]:
        t.add_row(f"{it['step']}{' (warm-up)' if it['warmup'] else ''}",
                  *(f"{it[c]:.1f}" for c in ("total_ms",) + PHASES + ("crypto_busy_ms",)))
    Console(width=160).print(t)
    print(f"all-reduce calls/iter {result['allreduce_calls_per_iteration']}, seals/rank {result['seals_per_rank']}, "
          f"opens/rank {result['opens_per_rank']}, broadcast seals/iter {result['broadcast_seals_per_iteration']}, "
          f"bounce seals/iter {result['bounce_seals_per_iteration']}, params sha256 {result['param_sha256'][:16]}…")
