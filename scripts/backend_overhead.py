"""What the torch.distributed face costs: ``dist.all_reduce`` on a ccddp group vs
``ccddp.bench.reference.all_reduce`` on a SecureGroup with the same settings (the engine
called directly), taking turns call by call (paired per iteration), at each size. The ratio is the Hodges-Lehmann median of the
per-call ratios with its 95 % signed-rank interval (``ccddp.stats.paired_ratio``).

    CCDDP_GROUP_SECRET=$(python -c 'import os;print(os.urandom(32).hex())') \\
    torchrun --nproc-per-node 2 scripts/backend_overhead.py --sizes 1M,64M --iters 400 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch
import torch.distributed as dist

import ccddp.backend  # noqa: F401
from ccddp.bench.reference import all_reduce
from ccddp.comm import CommSettings, SecureGroup, Transport
try:
    from ccddp.stats import paired_ratio
except ImportError:  # a tree before the statistics moved (the before/after comparison runs one)
    from ccddp.report.stats import paired_ratio


def size_bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1M,64M")
    p.add_argument("--iters", type=int, default=400)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--json")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    settings = CommSettings()
    backend_pg = dist.new_group(backend="ccddp", pg_options=ccddp.backend.Options(settings=settings))
    comm_group = SecureGroup(settings, transport=Transport.open(dist.new_group(backend="gloo"), settings.timeout_s))
    rows = []
    for text in a.sizes.split(","):
        numel = size_bytes(text) // 4
        x = torch.ones(numel)
        times = {"backend": [], "comm": []}
        for i in range(a.warmup + a.iters):
            order = ("backend", "comm") if i % 2 == 0 else ("comm", "backend")
            for impl in order:
                x.fill_(1.0)
                dist.barrier()
                t0 = time.perf_counter()
                if impl == "backend":
                    dist.all_reduce(x, group=backend_pg)
                else:
                    all_reduce(x, comm_group)
                dt = time.perf_counter() - t0
                assert float(x[0]) == n and float(x[-1]) == n
                if i >= a.warmup:
                    times[impl].append(dt)
        # The slowest rank's time per call, paired.
        mine = torch.tensor([times["backend"], times["comm"]], dtype=torch.float64)
        everyone = [torch.empty_like(mine) for _ in range(n)]
        dist.all_gather(everyone, mine)  # timings only (no model data), plaintext gloo
        slowest = torch.stack(everyone).amax(0)
        backend, comm = slowest[0].tolist(), slowest[1].tolist()
        ratios = sorted(b / c for b, c in zip(backend, comm))
        q = statistics.quantiles(ratios, n=4)
        hl = paired_ratio(dict(enumerate(backend)), dict(enumerate(comm)))
        rows.append({"size": text, "bytes": numel * 4, "backend_ms": statistics.median(backend) * 1e3,
                     "comm_ms": statistics.median(comm) * 1e3, "ratio": hl.estimate, "ratio_low": hl.low,
                     "ratio_high": hl.high, "ratio_median": statistics.median(ratios),
                     "ratio_p25": q[0], "ratio_p75": q[2], "iters": a.iters, "backend_s": backend, "comm_s": comm})
    if rank == 0:
        print(f"{'size':>6} {'dist.all_reduce (ms)':>21} {'comm.all_reduce (ms)':>21} {'ratio (95 % interval)':>22}"
              f" {'per-call p25-p75':>17}")
        for r in rows:
            print(f"{r['size']:>6} {r['backend_ms']:21.2f} {r['comm_ms']:21.2f} "
                  f"{r['ratio']:8.3f} ({r['ratio_low']:.3f}-{r['ratio_high']:.3f}) {r['ratio_p25']:8.3f}-{r['ratio_p75']:.3f}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"rows": rows, "world_size": n, "machine": platform.processor() or platform.machine(),
                           "cpus": os.cpu_count(), "loadavg": os.getloadavg(), "torch": torch.__version__}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
