"""FSDP2 where small collectives dominate: CC-on (ccddp) vs CC-off (gloo), paired, one launch.

ccddp has no FSDP workload (``ccddp train`` wraps DDP), so this is the issue-42 check on its
own: a model of many small layers, each its own ``fully_shard`` unit, so every step is
dozens of small all-gathers (forward, backward) and reduce-scatters (backward). Two copies
of the model (same seed) are sharded on two meshes of the same ranks: one over a gloo
group, one over a ccddp group. Steps alternate between them (gloo, ccddp, gloo, ...), each
after a barrier, so both see the same machine load; the ratio is the Hodges-Lehmann
estimate of ccddp/gloo over the pairs with its 95 % interval (``ccddp.stats``). The two
models' losses must agree at every step (the sealed collectives compute what gloo does).

    CCDDP_GROUP_SECRET=... python -m torch.distributed.run --nproc-per-node 2 \\
        benchmarks/small-ops/fsdp2.py --layers 32 --width 256 --steps 60 --json /tmp/fsdp2.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

import ccddp.backend  # noqa: F401  (registers the ccddp backend)
from ccddp.backend import Options
from ccddp.comm import CommSettings
from ccddp.stats import paired_ratio


def model(layers: int, width: int, mesh: DeviceMesh) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    m = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(layers)])
    for layer in m:
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m, torch.optim.SGD(m.parameters(), lr=1e-3)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, n = dist.get_rank(), dist.get_world_size()
    groups = {"gloo": dist.new_group(backend="gloo"),
              "ccddp": dist.new_group(backend="ccddp", pg_options=Options(
                  settings=CommSettings(impl="secure", timeout_s=120, trust_domains="rank")))}
    runs = {name: model(args.layers, args.width, DeviceMesh.from_group(pg, "cpu")) for name, pg in groups.items()}
    gen = torch.Generator().manual_seed(1 + rank)
    times: dict[str, dict[int, float]] = {name: {} for name in runs}
    losses: dict[str, list[float]] = {name: [] for name in runs}
    for step in range(args.warmup + args.steps):
        x = torch.randn(args.batch, args.width, generator=gen)
        for name, (m, opt) in runs.items():
            dist.barrier()
            t0 = time.perf_counter()
            loss = m(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            dt = time.perf_counter() - t0
            losses[name].append(float(loss.detach()))
            if step >= args.warmup:
                times[name][step] = dt
    # Each step's time is its slowest rank's.
    every: list = [None] * n
    dist.all_gather_object(every, times)   # timings only, on the CC-off default group
    if rank == 0:
        slowest = {name: {int(k): max(r[name][k] for r in every) for k in every[0][name]} for name in runs}
        iv = paired_ratio(slowest["ccddp"], slowest["gloo"])
        result = {
            "schema": "ccddp.small-ops.fsdp2/1", "world_size": n, "layers": args.layers, "width": args.width,
            "batch": args.batch, "steps": args.steps, "torch": torch.__version__,
            "params": sum(q.numel() for q in runs["gloo"][0].parameters()),
            "step_ms_median": {name: statistics.median(v.values()) * 1e3 for name, v in slowest.items()},
            "ratio_ccddp_over_gloo": {"estimate": iv.estimate, "low": iv.low, "high": iv.high, "n": iv.n},
            "losses_equal": losses["gloo"] == losses["ccddp"],
            "max_loss_diff": max(abs(a - b) for a, b in zip(losses["gloo"], losses["ccddp"])),
            "calls_per_step": {op: c // (args.warmup + args.steps) for op, c in groups["ccddp"].calls.items()},
        }
        print(json.dumps(result, indent=2))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
