"""A plain DDP training script, as PyTorch's DDP tutorial writes one (written here in our
own words): it knows nothing of ccddp and asks torch.distributed for gloo.

    torchrun --nproc-per-node 2 examples/ddp_tutorial.py            # gloo, plaintext
    ccddp launch --nproc-per-node 2 examples/ddp_tutorial.py        # the same script, sealed
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(ToyModel())
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(model.parameters(), lr=0.001)
    for step in range(args.steps):
        optimizer.zero_grad()
        outputs = model(torch.randn(20, 10))
        loss = loss_fn(outputs, torch.randn(20, 5))
        loss.backward()
        optimizer.step()
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    print(f"rank {rank}: backend {dist.get_backend()}, world {dist.get_world_size()}, "
          f"params checksum {checksum:.10f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__" and "RANK" in os.environ:
    main()
