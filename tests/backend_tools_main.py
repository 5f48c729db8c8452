"""PyTorch's distributed tools on one backend, under torchrun: what each rank ends with,
and the byte patterns of the model data that crossed (or would cross) the wire.

Run by tests/test_backend_tools.py once with ``gloo`` and once with ``ccddp``; the test
compares the results and searches the processes' socket writes for the markers.

    torchrun --nproc-per-node 2 tests/backend_tools_main.py BACKEND OUTDIR [CHECK ...]
"""

from __future__ import annotations

import gc
import io
import os
import sys
from contextlib import nullcontext

# A rank of ccddp's tests starts as ccddp's own ranks do (ccddp.startup): its imports without
# the cycle collector, frozen in main. Not through ccddp.startup: ``import ccddp`` below must
# come after torch's, as in a user's script (it registers the backend when torch is loaded).
gc.disable()
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ccddp  # noqa: F401  (registers the backend, as a user's script would)

MARKER_TEXT = "ccddp-object-marker-7f3a9c"


class Net(nn.Module):
    """Two layers, a buffer (BatchNorm) and, optionally, a branch unused in forward."""

    def __init__(self, unused: bool = False) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.bn = nn.BatchNorm1d(32)
        self.b = nn.Linear(32, 4)
        if unused:
            self.unused = nn.Linear(4, 4)

    def forward(self, x):
        return self.b(torch.tanh(self.bn(self.a(x))))


class Recorder:
    """Results to compare, and 16-byte windows of every tensor that carries model data."""

    def __init__(self) -> None:
        self.results: dict[str, torch.Tensor] = {}
        self.markers: dict[str, list[bytes]] = {}

    def mark(self, check: str, tensors) -> None:
        out = self.markers.setdefault(check, [])
        for t in tensors:
            raw = t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            for off in range(0, max(0, len(raw) - 16), max(16, len(raw) // 8)):
                w = raw[off:off + 16]
                if len(set(w)) >= 10:  # random-looking: never padding or small integers
                    out.append(w)

    def keep(self, check: str, module: nn.Module) -> None:
        self.results[check] = torch.cat([p.detach().float().view(-1) for p in module.parameters()])


def batch(step: int, rank: int, n: int = 8):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(n, 16, generator=g), torch.randn(n, 4, generator=g)


def fresh(seed: int = 0, unused: bool = False) -> nn.Module:
    torch.manual_seed(seed + dist.get_rank())  # different per rank: DDP's init sync must fix it
    return Net(unused)


def train(model, opt, rec: Recorder, check: str, steps: int, rank: int, autocast: bool = False,
          accumulate: int = 0) -> None:
    for step in range(steps):
        x, y = batch(step, rank)
        sync = model.no_sync() if step < accumulate else nullcontext()
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else nullcontext()
        with sync, ctx:
            loss = nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        if step >= accumulate:
            rec.mark(check, [p.grad for p in model.parameters() if p.grad is not None])
            opt.step()
            opt.zero_grad()


def check_ddp_options(rec: Recorder, rank: int, n: int) -> None:
    from torch.utils.data import DistributedSampler, TensorDataset

    data = TensorDataset(torch.arange(64.0))
    sampler = DistributedSampler(data, num_replicas=n, rank=rank, shuffle=True, seed=3)
    sampler.set_epoch(1)
    rec.results["sampler"] = torch.tensor(list(iter(sampler)), dtype=torch.float32)
    for name, kw in {"ddp_unused_views": dict(find_unused_parameters=True, gradient_as_bucket_view=True,
                                              bucket_cap_mb=0.001),
                     "ddp_static_graph": dict(static_graph=True)}.items():
        model = DDP(fresh(unused="find_unused_parameters" in kw), **kw)
        rec.mark(name, model.module.parameters())  # rank 0's parameters, as DDP broadcast them
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        # no_sync (gradient accumulation) where DDP allows it; bf16 autocast with the static graph.
        static = name == "ddp_static_graph"
        train(model, opt, rec, name, 3, rank, autocast=static, accumulate=0 if static else 1)
        rec.keep(name, model.module)
    # A checkpoint saved on rank 0 and loaded everywhere, then one more step.
    buf = io.BytesIO()
    torch.save(model.module.state_dict(), buf)
    blobs = [buf.getvalue() if rank == 0 else None]
    dist.broadcast_object_list(blobs, src=0)
    restored = DDP(fresh(7))
    restored.module.load_state_dict(torch.load(io.BytesIO(blobs[0])))
    train(restored, torch.optim.SGD(restored.parameters(), lr=0.1), rec, "checkpoint", 1, rank)
    rec.keep("checkpoint", restored.module)


def check_join(rec: Recorder, rank: int, n: int) -> None:
    from torch.distributed.algorithms.join import Join

    model = DDP(fresh())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Join([model]):
        train(model, opt, rec, "join", 2 + 2 * rank, rank)  # uneven inputs
    rec.keep("join", model.module)


def check_zero(rec: Recorder, rank: int, n: int) -> None:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = DDP(fresh())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    train(model, opt, rec, "zero", 3, rank)
    rec.mark("zero", model.module.parameters())  # shards broadcast after each step
    opt.consolidate_state_dict(to=0)
    rec.keep("zero", model.module)


def check_zero_overlap(rec: Recorder, rank: int, n: int) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook import hook_with_zero_step
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = DDP(fresh())
    if dist.get_backend() == "gloo":
        # torch refuses this on gloo ("may meet hangs"): the reference is the same updates
        # by plain SGD -- ZeRO's overlapped step skips the two iterations that build buckets.
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        first_update = 2
    else:
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD,
                                      overlap_with_ddp=True, lr=0.1)
        model.register_comm_hook(None, hook_with_zero_step(allreduce_hook, model, opt))
        first_update = 0
    for step in range(4):
        x, y = batch(step, rank)
        nn.functional.mse_loss(model(x), y).backward()
        if step >= first_update:
            opt.step()
        opt.zero_grad()
    rec.mark("zero_overlap", model.module.parameters())
    rec.keep("zero_overlap", model.module)


def check_compile(rec: Recorder, rank: int, n: int) -> None:
    model = DDP(fresh())
    # aot_eager: dynamo, DDP's graph splitting at buckets and AOT autograd, without
    # inductor's C++ build (minutes on two loaded cores).
    compiled = torch.compile(model, backend="aot_eager")
    train(compiled, torch.optim.SGD(model.parameters(), lr=0.1), rec, "compile", 2, rank)
    rec.keep("compile", model.module)


def check_comm_hooks(rec: Recorder, rank: int, n: int) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD

    for name, (state, hook) in {
        "hook_fp16": (None, default_hooks.fp16_compress_hook),
        "hook_powersgd": (powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                                 start_powerSGD_iter=2, min_compression_rate=0.5,
                                                 use_error_feedback=False, warm_start=False),
                          powerSGD.powerSGD_hook),
    }.items():
        model = DDP(fresh())
        model.register_comm_hook(state, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(4):
            x, y = batch(step, rank)
            nn.functional.mse_loss(model(x), y).backward()
            rec.mark(name, [p.grad.half() for p in model.parameters()] + [p.grad for p in model.parameters()])
            opt.step()
            opt.zero_grad()
        rec.keep(name, model.module)


def check_fsdp(rec: Recorder, rank: int, n: int) -> None:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)  # FSDP does not sync initial parameters: start equal
    model = Net()
    fully_shard(model.a)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        x, y = batch(step, rank)
        nn.functional.mse_loss(model(x), y).backward()
        rec.mark("fsdp", [p.grad.to_local() for p in model.parameters() if p.grad is not None])
        opt.step()
        opt.zero_grad()
    full = [p.full_tensor() for p in model.parameters()]
    rec.mark("fsdp", full)
    rec.results["fsdp"] = torch.cat([t.detach().float().view(-1) for t in full])


def check_objects(rec: Recorder, rank: int, n: int) -> None:
    got = [None] * n
    dist.all_gather_object(got, {"rank": rank, "secret": f"{MARKER_TEXT}-{rank}"})
    rec.markers.setdefault("objects", []).append(f"{MARKER_TEXT}-{rank}".encode())
    rec.results["objects"] = torch.tensor([float(g["rank"]) for g in got])


CHECKS = {"ddp_options": check_ddp_options, "join": check_join, "zero": check_zero,
          "zero_overlap": check_zero_overlap, "compile": check_compile, "comm_hooks": check_comm_hooks,
          "fsdp": check_fsdp, "objects": check_objects}


def main() -> None:
    gc.freeze()
    gc.enable()
    backend, out = sys.argv[1], sys.argv[2]
    names = sys.argv[3:] or list(CHECKS)
    dist.init_process_group(backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    rec = Recorder()
    for name in names:
        CHECKS[name](rec, rank, n)
        print(f"rank {rank}: {name} done", file=sys.stderr, flush=True)
    torch.save({"results": rec.results, "markers": rec.markers}, os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
