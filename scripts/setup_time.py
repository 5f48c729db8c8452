"""Time the creation of secure groups: how long a rank waits in ``SecureGroup(...)``
(session setup, key derivation, the second connection set), median over many groups.

Run under torchrun, e.g.::

    CCDDP_GROUP_SECRET=$(python -c "import secrets; print(secrets.token_hex(32))") \\
      torchrun --nproc-per-node 2 scripts/setup_time.py --groups 20 --json setup.json

Each group's time is the slowest rank's. The API used is the one every ccddp version has,
so the same script measures an older checkout (``PYTHONPATH=<old>/src``) for comparison.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ccddp.comm import CommSettings, SecureGroup, Transport
from ccddp.crypto.keys import GroupSecret


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", type=int, default=20)
    p.add_argument("--impl", default="secure")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    secret = GroupSecret.from_env()
    times = []
    for _ in range(args.groups):
        dist.barrier()
        t0 = time.perf_counter()
        g = SecureGroup(CommSettings(impl=args.impl, timeout_s=60), secret, transport=Transport.open(None, 60))
        times.append(time.perf_counter() - t0)
        g.close()
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)   # timing only: no model data
    ms = [t * 1e3 for t in slowest.tolist()]
    if dist.get_rank() == 0:
        summary = {"world_size": dist.get_world_size(), "impl": args.impl, "groups": args.groups,
                   "median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms), "ms": ms}
        print(f"SecureGroup setup, {args.groups} groups, world {summary['world_size']}: median "
              f"{summary['median_ms']:.1f} ms (min {summary['min_ms']:.1f}, max {summary['max_ms']:.1f})", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
