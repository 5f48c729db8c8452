"""A rank of the device-path tests (run under torchrun or ``ccddp launch``): the collectives
DDP and FSDP use, on tensors of ``--device``, each result checked against what every rank
computes locally; prints one JSON line per rank.

``--backend`` is what the script asks torch for (``ccddp launch`` serves gloo and NCCL
with ccddp); ``--host-frames`` makes every internal link carry its frames through host
buffers, as device frames do, so the staging runs on CPU ranks too; ``--ordered-wire`` then
sends the pipeline's frames on an ordered wire emulating NCCL's; ``--marker`` fills
the tensors with bytes a wiretap then looks for.

Example::

    torchrun --nproc-per-node 2 tests/device_paths_main.py --device cuda --placement staged
"""

from __future__ import annotations

import argparse
import json
import os

from ccddp.startup import pause_collector, resume_collector

pause_collector(__name__)  # a rank of ccddp's tests starts as ccddp's own ranks do (ccddp.startup)
import torch
import torch.distributed as dist

MARKER = 1234.5678


def _inp(rank: int, n: int, device: str, marker: bool) -> torch.Tensor:
    if marker:
        return torch.full((n,), MARKER + rank, dtype=torch.float32, device=device)
    return (torch.arange(n, dtype=torch.float32, device=device) % 97) * (rank + 1) + rank


STAGED = {"frames": 0}


def _force_host_frames(pg) -> None:
    """Every transport of ``pg`` stages its frames through host buffers (counted)."""
    from ccddp.comm import transport

    group = pg.endpoint
    group.transport.host_device_types = frozenset()
    pg.peer_links.transport.host_device_types = frozenset()
    real = transport.host_buffer

    def counted(frame):
        STAGED["frames"] += 1
        return real(frame)

    transport.host_buffer = counted


WIRE = {"wire": None}
LATE = {"copies": 0}


def _late_copies() -> None:
    """Every copy of a device frame to host says it is not done until it is waited for
    (as a GPU copy still queued behind its seal would): the pipeline must send it anyway,
    by waiting, before it blocks on a peer."""
    from ccddp.comm import pipeline

    real = pipeline.copy_to_host

    class Late:
        def __init__(self) -> None:
            self.waited = False

        def done(self) -> bool:
            return self.waited

        def result(self) -> None:
            self.waited = True

    def late(frame):
        host, fut = real(frame)
        assert fut is None, "a CPU frame's copy is done when it returns"
        LATE["copies"] += 1
        return host, Late()

    pipeline.copy_to_host = late


def _emulate_ordered_wire(pg, rank: int, n: int) -> None:
    """The group's device frames (all of its frames, with ``--host-frames``) take an
    ordered wire with NCCL's matching and ordering, emulated over two bare gloo sets."""
    from datetime import timedelta

    from ccddp.comm.transport import Transport
    from ccddp.testing.serial_wire import SerialWire

    store = dist.distributed_c10d._get_default_store()
    from ccddp.backend.policy import bare_links

    with bare_links():  # they carry only sealed frames
        up, down = [dist.ProcessGroupGloo(dist.PrefixStore(f"serial-wire-{name}/", store), rank, n,
                                          timedelta(seconds=60)) for name in ("up", "down")]
    WIRE["wire"] = pg.endpoint.transport.ordered = SerialWire(Transport(up, 60, downward=down), timeout_s=60)


def _ddp_matches_one_process(rank: int, n: int, device: str) -> bool:
    """Plain ``DistributedDataParallel`` on the default group (``device_ids`` on a GPU):
    three SGD steps equal one process training on every rank's batch at once."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(device)

    def batch(r: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(100 * step + r)
        return torch.randn(4, 8, generator=g).to(device), torch.randn(4, 1, generator=g).to(device)

    ddp = DDP(model(), device_ids=[torch.device(device).index] if device.startswith("cuda") else None)
    ref = model()
    opt, ref_opt = torch.optim.SGD(ddp.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(3):
        x, y = batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        xs, ys = zip(*(batch(r, step) for r in range(n)))
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(torch.cat(xs)), torch.cat(ys)).backward()
        ref_opt.step()
    return all(torch.allclose(a, b, atol=1e-5) for a, b in zip(ddp.module.parameters(), ref.parameters()))


def _wire_name(pg) -> str:
    """What carried the group's device frames: gloo, or the ordered wire's name."""
    group = getattr(pg, "endpoint", None)
    wire = group.transport.ordered if group is not None else None
    return "gloo" if wire is None else wire.name


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--backend", default="ccddp")
    ap.add_argument("--placement", default="auto")
    ap.add_argument("--engine", default="auto")
    ap.add_argument("--host-frames", action="store_true")
    ap.add_argument("--marker", action="store_true")
    ap.add_argument("--ordered-wire", action="store_true", help="emulated NCCL ordering for device frames")
    ap.add_argument("--late-copies", action="store_true", help="copies to host report done only when waited for")
    ap.add_argument("--numel", type=int, default=4099)
    args = ap.parse_args()

    import ccddp.backend  # noqa: F401  (registers the backend outside ccddp launch)
    from ccddp.backend import Options
    from ccddp.comm import CommSettings

    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = args.device
    if device == "cuda":
        device = f"cuda:{int(os.environ['LOCAL_RANK']) % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
    settings = CommSettings(segment_bytes=4096, chains=1, placement=args.placement, aead_engine=args.engine)
    options = Options(settings=settings) if "ccddp" in args.backend else None
    dist.init_process_group(args.backend, pg_options=options)
    pg = dist.group.WORLD
    if args.host_frames:
        _force_host_frames(pg)
    if args.late_copies:
        _late_copies()
    if args.ordered_wire:
        _emulate_ordered_wire(pg, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    resume_collector()          # the imports are done
    m = args.numel
    checks: dict[str, bool] = {}
    everyone = [_inp(r, m, device, args.marker) for r in range(n)]

    x = everyone[rank].clone()
    dist.all_reduce(x)
    checks["all_reduce"] = torch.allclose(x, sum(everyone), rtol=1e-5)

    x = everyone[rank].clone()
    work = dist.all_reduce(x, op=dist.ReduceOp.MAX, async_op=True)
    fut = work.get_future().then(lambda f: f.value()[0] * 2)
    checks["all_reduce_future"] = torch.equal(fut.wait(), torch.stack(everyone).max(0).values * 2)

    x = everyone[rank].clone()
    dist.broadcast(x, src=n - 1)
    checks["broadcast"] = torch.equal(x, everyone[n - 1])

    out = torch.empty(n * m, device=device)
    dist.all_gather_into_tensor(out, everyone[rank])
    checks["all_gather_into_tensor"] = torch.equal(out, torch.cat(everyone))

    big = torch.cat([e * (i + 1) for i, e in enumerate(everyone)])           # n*m on every rank alike
    mine = torch.empty(m, device=device)
    dist.reduce_scatter_tensor(mine, big * (rank + 1))
    want = big.view(n, m)[rank] * sum(r + 1 for r in range(n))
    checks["reduce_scatter_tensor"] = torch.allclose(mine, want, rtol=1e-5)

    outs = [torch.empty(m, device=device) for _ in range(n)]
    dist.all_gather(outs, everyone[rank])
    checks["all_gather"] = all(torch.equal(o, e) for o, e in zip(outs, everyone))

    base = everyone[rank].clone()
    dist.all_reduce(base[::2])                                  # a strided view: reduced in a copy, written back
    checks["all_reduce_strided"] = (torch.allclose(base[::2], sum(e[::2] for e in everyone), rtol=1e-5)
                                    and torch.equal(base[1::2], everyone[rank][1::2]))

    if n > 1:
        if rank == 0:
            dist.send(everyone[0] + 7, dst=1)
        elif rank == 1:
            got = torch.empty(m, device=device)
            dist.recv(got, src=0)
            checks["send_recv"] = torch.equal(got, everyone[0] + 7)

    checks["ddp"] = _ddp_matches_one_process(rank, n, device)

    dist.barrier()
    print(json.dumps({"rank": rank, "backend": dist.get_backend(), "device": str(x.device), "checks": checks,
                      "staged_frames": STAGED["frames"],
                      "ordered_groups": WIRE["wire"].groups_posted if WIRE["wire"] else 0,
                      "late_copies": LATE["copies"],
                      "device_wire": _wire_name(pg)}),
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
