"""Per-op breakdown of a small sealed all-reduce (issue 42), with ccddp's timing probe.

Run it on N local ranks; it needs ``CCDDP_GROUP_SECRET`` and ``CCDDP_PROBE`` (a path
prefix: ``ccddp.comm.probe`` is on only when that is set)::

    CCDDP_GROUP_SECRET=$(python -c "import secrets; print(secrets.token_hex(32))") \\
    CCDDP_PROBE=/tmp/probe python -m torch.distributed.run --nproc-per-node 2 \\
        benchmarks/small-ops/breakdown.py --size 4K --iters 300 --json /tmp/breakdown.json

Three paths take turns call by call, each call after a barrier (as ``ccddp bench
collectives`` does): gloo's own all-reduce (the CC-off reference), the engine
(``run_all_reduce`` on a ``SecureGroup``: what ``--impl secure`` times) and the backend
(``dist.all_reduce`` on a ``ccddp`` group: what a user calls). The probe stamps each
stage of the two sealed paths; rank 0 prints, per stage, the median microseconds per op
over the measured calls of every rank, and writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ccddp.backend import Options
from ccddp.bench.options import parse_size
from ccddp.bench.reference import open_impl
from ccddp.comm import CommSettings, probe
from ccddp.comm.collectives import run_all_gather, run_all_reduce
from ccddp.comm.reduce import Reduction


def summarize(prefix: str, world_size: int) -> dict:
    """Per op name, the median microseconds of each stage over every rank's probed ops
    (the files ``CCDDP_PROBE=PREFIX`` wrote at exit): for runs this script does not drive,
    such as ``fsdp2.py``, whose ops the queue's worker runs and probes."""
    out = {}
    every = [json.load(open(f"{prefix}.rank{r}.json"))["ops"] for r in range(world_size)]
    for name in sorted({k for ops in every for k in ops}):
        ops = [op for r in every for op in r.get(name, [])]
        stages = list(dict.fromkeys(s for op in ops for s in op))
        out[name] = {"ops": len(ops), "total_us_median": statistics.median(sum(op.values()) for op in ops) / 1e3,
                     "stages_us_median": {s: statistics.median(op.get(s, 0) for op in ops) / 1e3 for s in stages}}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="4K")
    p.add_argument("--op", choices=("all_reduce", "all_gather"), default="all_reduce",
                   help="all_gather: each rank's buffer of --size gathered (FSDP2's op)")
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--json", default=None)
    p.add_argument("--summarize", metavar="PREFIX", default=None,
                   help="only summarize the probe files PREFIX.rank<R>.json of another run")
    p.add_argument("--world-size", type=int, default=2, help="with --summarize: how many rank files")
    args = p.parse_args()
    if args.summarize:
        summary = summarize(args.summarize, args.world_size)
        print(json.dumps(summary, indent=2))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=2)
        return
    if not probe.ON:
        raise SystemExit("set CCDDP_PROBE (a path prefix) to turn the probe on")
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, n = dist.get_rank(), dist.get_world_size()
    settings = CommSettings(impl="secure", timeout_s=120)
    engine = open_impl("secure", settings)
    backend = dist.new_group(backend="ccddp", timeout=timedelta(seconds=120),
                             pg_options=Options(settings=settings.with_(trust_domains="rank")))
    gloo = dist.new_group(backend="gloo", timeout=timedelta(seconds=120))
    numel = parse_size(args.size) // 4
    buf = torch.ones(numel)
    out = torch.empty(numel * n)
    walls: dict[str, list[float]] = {"gloo": [], "engine": [], "backend": []}
    for i in range(args.warmup + args.iters):
        if i == args.warmup:
            probe.reset()
        for path in walls:
            buf.fill_(1.0)
            dist.barrier()
            t0 = time.perf_counter_ns()
            gather = args.op == "all_gather"
            if path != "gloo":
                probe.begin(path)
            if path == "gloo":
                (dist.all_gather_into_tensor(out, buf, group=gloo) if gather else dist.all_reduce(buf, group=gloo))
            elif path == "engine":
                run_all_gather(engine, out, buf) if gather else run_all_reduce(engine, buf, Reduction.SUM)
            else:
                (dist.all_gather_into_tensor(out, buf, group=backend) if gather
                 else dist.all_reduce(buf, group=backend))
            if path != "gloo":
                probe.end("return to caller")
            dt = time.perf_counter_ns() - t0
            if i >= args.warmup:
                walls[path].append(dt / 1e3)
            assert (float(out.sum()) == n * numel) if gather else float(buf[0]) == n
    mine = {"walls_us": walls, "ops": probe.ops()}
    every: list = [None] * n
    dist.all_gather_object(every, mine)   # plaintext: timings only, on the CC-off default group
    if rank == 0:
        summary = {"op": args.op, "size_bytes": numel * 4, "world_size": n, "iters": args.iters, "paths": {}}
        for path in walls:
            wall = [w for r in every for w in r["walls_us"][path]]
            row = {"wall_us_median": statistics.median(wall),
                   "wall_us_q1_q3": statistics.quantiles(wall, n=4)[::2]}
            if path != "gloo":
                ops = [op for r in every for op in r["ops"].get(path, [])]
                stages = list(dict.fromkeys(s for op in ops for s in op))
                row["stages_us_median"] = {s: statistics.median(op.get(s, 0) for op in ops) / 1e3
                                           for s in stages}
                row["stages_us_mean"] = {s: statistics.fmean(op.get(s, 0) for op in ops) / 1e3 for s in stages}
                row["probed_total_us_median"] = statistics.median(sum(op.values()) for op in ops) / 1e3
            summary["paths"][path] = row
        print(f"{args.size} {args.op.replace('_', '-')}, {n} ranks, {args.iters} calls per path (median over calls of every rank)")
        for path, row in summary["paths"].items():
            print(f"  {path:8s} wall {row['wall_us_median']:8.1f} us  (q1-q3 "
                  f"{row['wall_us_q1_q3'][0]:.1f}-{row['wall_us_q1_q3'][1]:.1f})")
            for s, us in row.get("stages_us_median", {}).items():
                print(f"      {s:40s} {us:8.1f} us median  {row['stages_us_mean'][s]:8.1f} mean")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=2)
    dist.barrier()
    engine.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
