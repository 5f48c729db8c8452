"""``ccddp train``: DDP training of a workload, CC-off or CC-on, timed phase by phase.

Per iteration and rank: data (synthetic batch), bounce (sealing/opening the batch, CC-on;
a plain staging copy, CC-off), forward (including the secure buffer broadcast), backward
compute (until the last bucket is handed to communication), exposed communication (from
then until backward returns with every bucket reduced), optimizer, and crypto busy time.
Run under torchrun (``python -m ccddp.bench.train --workload resnet50 ...``) or through
the CLI, which launches the ranks itself.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time

import torch
import torch.distributed as dist

from ccddp.bench.machine import machine_info
from ccddp.bench.worker import init_from_env, run_worker
from ccddp.comm import CommSettings, SecureGroup
from ccddp.comm.control import gather_json
from ccddp.crypto import derive_purpose_key
from ccddp.crypto.counters import CryptoCounters
from ccddp.ddp import BouncePath, SecureDDP
from ccddp.errors import ConfigError

SCHEMA = "ccddp.train/1"
SCHEDULES = {"naive": "secure-naive", "pipelined": "secure"}
PHASES = ("data_ms", "bounce_ms", "forward_ms", "backward_ms", "exposed_comm_ms", "optimizer_ms")


def build_parser(add_help: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ccddp train", description=__doc__.splitlines()[0], add_help=add_help)
    p.add_argument("--workload", required=True, help="graphsage, resnet50, resnet101, bert-base, bert-large, "
                                                     "gpt2-large, gpt2-xl")
    p.add_argument("--size", default="default", choices=["default", "tiny"], help="tiny: a few layers, for tests")
    p.add_argument("--cc", default="on", choices=["on", "off"])
    p.add_argument("--schedule", default="pipelined", choices=sorted(SCHEDULES),
                   help="CC-on all-reduce schedule: the paper's naive one or ccddp's pipelined one")
    p.add_argument("--steps", type=int, default=3, help="measured iterations")
    p.add_argument("--warmup", type=int, default=2,
                   help="iterations before measuring (DDP rebuilds its buckets in the forward of iteration 1)")
    p.add_argument("--batch-size", type=int, default=None, help="per rank (default: the workload's)")
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--dtype", default=None, help="parameter dtype override (float32, bfloat16, float16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP bucket cap (default: DDP's 25 MiB, 1 MiB first)")
    p.add_argument("--segment-mb", type=float, default=CommSettings().segment_bytes / (1 << 20))
    p.add_argument("--chains", type=int, default=CommSettings().chains)
    p.add_argument("--tag", default="segment", choices=["segment", "message"])
    p.add_argument("--timeout", type=float, default=300.0, help="seconds any rank may wait on a peer")
    p.add_argument("--json", default=None, help="write results here (rank 0)")
    p.add_argument("--variants", default=None, help=argparse.SUPPRESS)  # characterize: off,on:naive,... in one launch
    p.add_argument("--out-dir", default=None, help=argparse.SUPPRESS)  # characterize: one JSON per variant
    return p


def parse_variant(text: str) -> tuple[str, str]:
    """``off`` / ``on:naive`` / ``on:pipelined`` -> (cc, schedule)."""
    cc, _, schedule = text.partition(":")
    if cc not in ("on", "off") or (cc == "on" and schedule not in SCHEDULES):
        raise ConfigError(f"bad variant {text!r}: use off, on:naive or on:pipelined")
    return cc, schedule or "pipelined"


def variant_key(workload: str, world_size: int, cc: str, schedule: str | None) -> str:
    return f"{workload}/ws{world_size}/cc-{cc}" + (f"/{schedule}" if cc == "on" else "")


def settings_from(args: argparse.Namespace) -> CommSettings:
    return CommSettings(impl=SCHEDULES[args.schedule] if args.cc == "on" else "gloo",
                        segment_bytes=int(args.segment_mb * (1 << 20)), chains=args.chains, tag=args.tag,
                        timeout_s=args.timeout)


def workload_from(args: argparse.Namespace):
    from ccddp.workloads import get_workload

    overrides = {"batch_size": args.batch_size, "seq_len": args.seq_len, "image_size": args.image_size,
                 "dtype": args.dtype, "seed": args.seed}
    return get_workload(args.workload, size=args.size, **{k: v for k, v in overrides.items() if v is not None})


def param_sha256(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in module.parameters():
        h.update(p.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _total(counters: dict) -> dict:
    keys = counters["gradients"].keys()
    return {k: counters["gradients"][k] + counters["broadcasts"][k] for k in keys}


def gather_records(iterations: list[dict], model: SecureDDP, settings: CommSettings) -> list[list[dict]]:
    """Every rank's iteration records, after the last step. They carry the loss (model
    data), so CC-on seals them on the DDP group; CC-off sends them as its gradients go,
    in plaintext. JSON either way, never pickle."""
    group = model.sync_group if model.sync_group is not None else SecureGroup(settings)
    return gather_json(iterations, group)


def train(args: argparse.Namespace) -> dict:
    rank, n = dist.get_rank(), dist.get_world_size()
    wl = workload_from(args)
    settings = settings_from(args)
    # None in CC-on: SecureGroup reads the environment (shared secret or identity keys).
    secret = None
    torch.manual_seed(args.seed)
    module = wl.build_model(device="cpu")
    # Gradients as views of DDP's buckets: no second copy of every gradient (GPT-2 sizes
    # would not fit twice on this machine); the same in both modes.
    model = SecureDDP(module, cc=args.cc, settings=settings, secret=secret, bucket_cap_mb=args.bucket_cap_mb,
                      gradient_as_bucket_view=True)
    bounce = None
    if args.cc == "on":
        # The group's secret: the pre-shared one, or the one agreed by key establishment.
        bounce = BouncePath(derive_purpose_key(model.sync_group.secret, model.sync_group.session_id, f"bounce/{rank}"),
                            session_id=model.sync_group.session_id)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    state = model.hook_state
    iterations = []
    for step in range(args.warmup + args.steps):
        before = model.counters()
        bounce_before = bounce.counters.snapshot() if bounce else CryptoCounters().snapshot()
        buckets_before = state.buckets
        t0 = time.perf_counter()
        batch = wl.make_batch(step, rank, n)
        t1 = time.perf_counter()
        batch = bounce.receive(bounce.stage(batch)) if bounce else {k: v.clone() for k, v in batch.items()}
        t2 = time.perf_counter()
        loss = wl.loss(model, batch)
        t3 = time.perf_counter()
        state.last_bucket_ready = t3
        try:
            loss.backward()
        except RuntimeError:
            if model.comm_failure() is not None:
                raise model.comm_failure() from None
            raise
        t4 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=False)
        t5 = time.perf_counter()
        if not torch.isfinite(loss.detach()).all():
            raise ConfigError(f"loss is not finite at step {step}; lower --lr")
        after = model.counters()
        grads = CryptoCounters.diff(after["gradients"], before["gradients"])
        sync = CryptoCounters.diff(after["broadcasts"], before["broadcasts"])
        bnc = CryptoCounters.diff(bounce.counters.snapshot(), bounce_before) if bounce else None
        busy = grads["busy_seconds"] + sync["busy_seconds"] + (bnc["busy_seconds"] if bnc else 0.0)
        iterations.append({
            "step": step, "warmup": step < args.warmup, "total_ms": (t5 - t0) * 1e3,
            "data_ms": (t1 - t0) * 1e3, "bounce_ms": (t2 - t1) * 1e3, "forward_ms": (t3 - t2) * 1e3,
            "backward_ms": (state.last_bucket_ready - t3) * 1e3, "exposed_comm_ms": (t4 - state.last_bucket_ready) * 1e3,
            "optimizer_ms": (t5 - t4) * 1e3, "crypto_busy_ms": busy * 1e3,
            "allreduce_calls": state.buckets - buckets_before,
            "seals": grads["seals"], "opens": grads["opens"], "segments_sealed": grads["segments_sealed"],
            "broadcast_seals": sync["seals"], "broadcast_opens": sync["opens"],
            "bounce_seals": bnc["seals"] if bnc else 0, "bounce_opens": bnc["opens"] if bnc else 0,
            "control_seals": grads["control_seals"] + sync["control_seals"],
            "loss": float(loss.detach().float()),
        })
    per_rank = gather_records(iterations, model, settings)
    sha = param_sha256(model.module)
    model.close()
    measured = [it for it in iterations if not it["warmup"]]
    slowest = [max(per_rank[r][i]["total_ms"] for r in range(n)) for i in range(len(iterations))]
    for it, s in zip(iterations, slowest):
        it["slowest_rank_total_ms"] = s
    summary = {k: statistics.median(it[k] for it in measured) for k in PHASES + ("total_ms", "crypto_busy_ms")}
    summary["slowest_rank_total_ms"] = statistics.median(it["slowest_rank_total_ms"] for it in measured)
    steady = measured[-1]
    return {
        "schema": SCHEMA, "machine": machine_info(), "workload": wl.name, "size": args.size,
        "shapes": wl.shapes, "num_params": wl.num_params, "world_size": n, "cc": args.cc,
        "schedule": args.schedule if args.cc == "on" else None, "settings": settings.as_dict(),
        "bucket_cap_mb": args.bucket_cap_mb, "optimizer": f"SGD(lr={args.lr})", "steps": args.steps,
        "warmup": args.warmup, "iterations": iterations, "summary": summary,
        "allreduce_calls_per_iteration": steady["allreduce_calls"],
        "seals_per_rank": steady["seals"], "opens_per_rank": steady["opens"],
        "broadcast_seals_per_iteration": steady["broadcast_seals"],
        "bounce_seals_per_iteration": steady["bounce_seals"],
        "param_sha256": sha, "per_rank_total_ms": [[it["total_ms"] for it in r] for r in per_rank],
    }


def run_variants(args: argparse.Namespace) -> None:
    """Several variants in one launch (one torch/transformers import), each written to
    ``out_dir/<key>.json`` as soon as it is done, so an interrupted sweep keeps them."""
    import gc
    import os

    for text in args.variants.split(","):
        cc, schedule = parse_variant(text)
        one = argparse.Namespace(**{**vars(args), "cc": cc, "schedule": schedule})
        result = train(one)
        if dist.get_rank() == 0:
            key = variant_key(result["workload"], result["world_size"], cc, schedule if cc == "on" else None)
            path = os.path.join(args.out_dir, key.replace("/", "__") + ".json")
            with open(path + ".tmp", "w") as f:
                json.dump(result, f)
            os.replace(path + ".tmp", path)
        # DDP's reducer and hooks hold reference cycles: without a collection the previous
        # variant's parameters and gradients (GPT2-XL: 6 GB per rank) outlive it.
        del result
        gc.collect()
        dist.barrier()


def main() -> None:
    args = build_parser().parse_args()
    init_from_env(args.timeout)
    if args.variants:
        run_variants(args)
        return
    result = train(args)
    if dist.get_rank() == 0:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
        s = result["summary"]
        print(f"{result['workload']} cc={result['cc']} world={result['world_size']}: "
              f"median {s['total_ms']:.1f} ms/iter (" + ", ".join(f"{k[:-3]} {s[k]:.1f}" for k in PHASES) +
              f", crypto busy {s['crypto_busy_ms']:.1f}) all-reduces/iter {result['allreduce_calls_per_iteration']} "
              f"seals/rank {result['seals_per_rank']}", flush=True)


if __name__ == "__main__":
    run_worker(main)
