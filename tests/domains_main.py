"""DDP training under trust domains (``ccddp launch --nnodes 2 ... domains_main.py OUT``,
``CCDDP_SETTINGS='{"trust_domains": "node"}'``), or the same under gloo for reference
(:func:`train` on ranks a test forks).

Each rank trains a small model a few steps, all-reduces a tensor of its own random values
(the markers a test looks for on the wire), and writes to ``OUT/rank{r}.json`` its final
parameters, its marker values, its process id and the local ports of its TCP connections
(so a test can tell which rank each recorded connection led to).
"""

from __future__ import annotations

import json
import os
import sys

import psutil
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def markers(rank: int) -> torch.Tensor:
    return torch.rand(8192, generator=torch.Generator().manual_seed(777 + rank))


def main() -> None:
    dist.init_process_group("gloo")       # served by ccddp under ccddp launch
    train(sys.argv[1])


def train(out: str) -> None:
    """The run on the default group already made (also the gloo reference's ranks, which
    tests/dist_util.py's ``run_ranks`` forks)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                                        torch.nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        g = torch.Generator().manual_seed(10 * step + rank)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    mine = markers(rank)
    total = mine.clone()
    dist.all_reduce(total)
    proc = psutil.Process()
    conns = proc.net_connections(kind="tcp") if hasattr(proc, "net_connections") else proc.connections(kind="tcp")
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "pid": os.getpid(), "backend": str(dist.get_backend()),
                   "params": [p.detach().view(-1).tolist() for p in model.parameters()],
                   "sum_ok": bool(torch.allclose(total, sum(markers(r) for r in range(n)), atol=1e-5)),
                   "ports": sorted({c.laddr.port for c in conns})}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
