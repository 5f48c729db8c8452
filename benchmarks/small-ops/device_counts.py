"""What one small all-reduce costs the device engine, counted (issue 42): engine calls,
kernel launches, host-to-device uploads, device-to-host syncs and frame copies per op.

On a machine without a GPU it runs the CPU twin: the same pipeline with the Triton engine
interpreted on CPU tensors (``aead_engine="triton"``, ``TRITON_INTERPRET=1``) and every
frame staged through a host buffer as a device frame is on the gloo wire (ranks sharing a
GPU). With ``--device cuda`` it counts the real thing. Counting wraps the engine's own
entry points; nothing else changes::

    CCDDP_GROUP_SECRET=... python -m torch.distributed.run --nproc-per-node 2 \\
        benchmarks/small-ops/device_counts.py --size 4K --json /tmp/counts.json

Two schedules are counted: the ring (``EXCHANGE_MAX_BYTES = 0``: what a two-rank all-reduce
was before issue 42) and the two-rank exchange (the default now below 1 MiB).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
from datetime import timedelta

import torch
import torch.distributed as dist

COUNTS: collections.Counter = collections.Counter()


def instrument() -> None:
    from ccddp.comm import pipeline, transport
    from ccddp.crypto.device import engine

    real_run, real_desc, real_kernels = engine.DeviceAESGCM._run, engine.DeviceAESGCM._descriptors, engine._kernels

    def run(self, segments, src, dst, pad, seal):
        COUNTS["engine seals" if seal else "engine opens"] += 1
        if not seal:
            COUNTS["device-to-host syncs (verdicts .cpu())"] += 1
        return real_run(self, segments, src, dst, pad, seal)

    def descriptors(self, segments, kernels, device):
        COUNTS["host-to-device uploads (descriptor table, AAD)"] += 2
        return real_desc(self, segments, kernels, device)

    class Counted:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            COUNTS["kernel launches"] += 1
            COUNTS[f"  {self.name}"] += 1
            return self.kernel[grid]

    wrapped = {}

    def kernels(device):
        k = real_kernels(device)
        if id(k) not in wrapped:
            for name in ("gcm_pass", "gcm_finish", "ctr_open", "keystream"):
                setattr(k, name, Counted(name, getattr(k, name)))
            wrapped[id(k)] = k
        return k

    engine.DeviceAESGCM._run, engine.DeviceAESGCM._descriptors, engine._kernels = run, descriptors, kernels
    real_copy, real_buffer = pipeline.copy_to_host, transport.host_buffer

    def copy(frame):
        COUNTS["sent frames copied to host (gloo wire)"] += 1
        return real_copy(frame)

    def host_buffer(frame):
        COUNTS["host buffers (staged frames)"] += 1
        return real_buffer(frame)

    pipeline.copy_to_host, transport.host_buffer = copy, host_buffer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="4K")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from ccddp.bench.options import parse_size
    from ccddp.comm import CommSettings, SecureGroup, Transport, collectives
    from ccddp.comm.reduce import Reduction

    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank, n = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    device = torch.device("cuda" if args.device == "cuda" else "cpu")
    settings = CommSettings(impl="secure", timeout_s=300, aead_engine="triton" if args.device == "cpu" else "auto")
    g = SecureGroup(settings, transport=Transport.open(None, 300))
    if args.device == "cpu":
        g.transport.host_device_types = frozenset()      # CPU frames cross as device frames do
    instrument()
    numel = parse_size(args.size) // 4
    result = {"size_bytes": numel * 4, "world_size": n, "device": args.device, "per_op": {}}
    if args.device == "cpu":
        result["note"] = ("CPU twin: the descriptor (one seal, one open, two host buffers per op) goes through the "
                          "interpreted engine here too; on a GPU it is host bytes sealed by OpenSSL, so the data's "
                          "share is the rest")
    default = collectives.EXCHANGE_MAX_BYTES
    for name, limit in (("ring (before issue 42)", 0), ("exchange (issue 42)", default)):
        collectives.EXCHANGE_MAX_BYTES = limit
        x = torch.ones(numel, device=device)
        collectives.run_all_reduce(g, x, Reduction.SUM)     # warm-up: compiles, key setup
        COUNTS.clear()
        for _ in range(args.reps):
            x = torch.ones(numel, device=device)
            collectives.run_all_reduce(g, x, Reduction.SUM)
            assert bool((x == n).all())
        result["per_op"][name] = {k: v / args.reps for k, v in sorted(COUNTS.items())}
    collectives.EXCHANGE_MAX_BYTES = default
    if rank == 0:
        print(json.dumps(result, indent=2))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
    dist.barrier()
    g.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
