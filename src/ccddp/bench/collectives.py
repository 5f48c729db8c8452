"""``ccddp bench collectives``: time each collective implementation, nccl-tests style.

Each rank fills its buffer with values whose sum is known in closed form, so every
result is checked (``#wrong``) without a second collective. The implementations take
turns call by call, so besides each one's median time every row carries its median
per-iteration ratio to every other (``paired_ratios``), which the machine's drift between
seconds does not move. gloo's own collectives (the CC-off reference) and the engine's
schedules are called through :mod:`ccddp.bench.reference`; ``secure-domains`` is the
ccddp backend itself, called as a user calls it. With ``--device cuda`` the buffers live
on each rank's GPU and every implementation is a torch.distributed group (gloo with CUDA
tensors; the ccddp backend, with ``--placement``, for the secure ones), each call timed to
the end of its device work. Run under torchrun
(``python -m ccddp.bench.collectives --sizes 1M ...``) or through the CLI, which
launches the ranks itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from ccddp.startup import pause_collector

pause_collector(__name__)  # run as a rank: the imports below without the cycle collector (ccddp.startup)
import torch
import torch.distributed as dist

from ccddp.bench.devices import describe, rank_device, synchronize
from ccddp.bench.machine import machine_info, process_cpu_seconds
from ccddp.bench.options import (BACKEND_IMPL, DTYPE_NAMES, OPS, build_collectives_parser,  # noqa: F401
                                 check_collectives, parse_size, trust_domains_setting)
from ccddp.bench.reference import GlooReference, all_gather, all_reduce, broadcast, open_impl, reduce_scatter
from ccddp.bench.worker import init_from_env, run_worker
from ccddp.comm import CommSettings, SecureGroup, Transport
from ccddp.comm.control import gather_json
from ccddp.crypto.counters import CryptoCounters

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}
SCHEMA = "ccddp.bench.collectives/1"


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw = algbw * factor."""
    return {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n,
            "all_gather": (n - 1) / n, "broadcast": 1.0}[op]


def _pattern(numel: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    # Small integers are exact in every dtype and in any summation order.
    return ((torch.arange(numel) % 7) + rank + 1).to(dtype)


class _BackendGroup:
    """A ccddp backend group over every rank with the engine's settings and a trust-domain
    map; its counters are the backend's (the shard ring's across domains included). With
    ``backend="gloo"``: torch's own gloo group, plaintext, nothing sealed (the CC-off
    reference on CUDA tensors)."""

    def __init__(self, settings: CommSettings, backend: str = "ccddp") -> None:
        from datetime import timedelta

        from ccddp.backend import Options

        options = {"pg_options": Options(settings=settings)} if backend == "ccddp" else {}
        self.pg = dist.new_group(backend=backend, timeout=timedelta(seconds=settings.timeout_s), **options)
        self.backend = backend
        self.settings = settings
        self.counters = self  # read like a SecureGroup's: counters.snapshot()

    def snapshot(self) -> dict:
        return self.pg.crypto_counters() if self.backend == "ccddp" else CryptoCounters().snapshot()

    def close(self) -> None:
        pass  # the group lives until destroy_process_group


class _Case:
    """Buffers of one (op, size), allocated once and refilled in place before every call,
    as nccl-tests does: allocating and freeing hundreds of MiB per iteration makes the
    kernel zero and reclaim pages during the timed calls that follow. Every
    implementation runs on the same buffers."""

    def __init__(self, op: str, n: int, r: int, numel: int, dtype: torch.dtype,
                 device: torch.device = torch.device("cpu")) -> None:
        self.op = op
        self.device = device
        base = torch.arange(numel) % 7
        if op == "all_reduce":
            self.src = _pattern(numel, r, dtype)
            self.buf = torch.empty_like(self.src)
            self.expect = (base * n + n * (n + 1) // 2).to(dtype)
        elif op == "reduce_scatter":
            per = numel // n
            self.src = _pattern(per * n, r, dtype)
            self.inp, self.buf = torch.empty_like(self.src), torch.empty(per, dtype=dtype)
            self.expect = (base[r * per:(r + 1) * per] * n + n * (n + 1) // 2).to(dtype)
        elif op == "all_gather":
            per = numel // n
            self.src = _pattern(per, r, dtype)
            self.inp, self.buf = torch.empty_like(self.src), torch.empty(per * n, dtype=dtype)
            self.expect = torch.cat([_pattern(per, k, dtype) for k in range(n)])
        else:
            self.src = _pattern(numel, r, dtype)
            self.buf = torch.empty_like(self.src)
            self.expect = _pattern(numel, 0, dtype)
        if device.type != "cpu":  # made on the host (the same values), then moved once
            for name in ("src", "buf", "expect", "inp"):
                if hasattr(self, name):
                    setattr(self, name, getattr(self, name).to(device))
        self.diff = torch.empty(self.expect.numel(), dtype=torch.bool, device=device)

    def fill(self) -> None:
        """Refill the buffers the call reads and writes."""
        if self.op in ("reduce_scatter", "all_gather"):
            self.inp.copy_(self.src)
            self.buf.fill_(0)
        else:
            self.buf.copy_(self.src)

    def call(self, g: "SecureGroup | GlooReference | _BackendGroup") -> tuple[float, float]:
        """One timed call of ``g``'s implementation; returns (seconds, CPU seconds of
        this process)."""
        op = self.op
        c0, t0 = process_cpu_seconds(), time.perf_counter()
        if isinstance(g, _BackendGroup):
            if op == "all_reduce":
                dist.all_reduce(self.buf, group=g.pg)
            elif op == "reduce_scatter":
                dist.reduce_scatter_tensor(self.buf, self.inp, group=g.pg)
            elif op == "all_gather":
                dist.all_gather_into_tensor(self.buf, self.inp, group=g.pg)
            else:
                dist.broadcast(self.buf, 0, group=g.pg)
        elif op == "all_reduce":
            all_reduce(self.buf, g)
        elif op == "reduce_scatter":
            reduce_scatter(self.buf, self.inp, g)
        elif op == "all_gather":
            all_gather(self.buf, self.inp, g)
        else:
            broadcast(self.buf, 0, g)
        synchronize(self.device)
        return time.perf_counter() - t0, process_cpu_seconds() - c0

    def wrong(self) -> int:
        """Elements of the result that differ from the closed-form expectation."""
        torch.ne(self.buf, self.expect, out=self.diff)
        # count_nonzero, not sum: a bool sum first widens to int64, a fresh 8-byte-per-
        # element tensor whose page faults cost more CPU than a 64 MiB secure all-reduce.
        return int(torch.count_nonzero(self.diff))


def tag_granularity(s: CommSettings) -> str:
    """What one AES-GCM tag covers under these settings."""
    if not s.secure:
        return "none"
    if s.impl == "secure-naive" or s.tag == "message":
        return "message"
    return f"segment {s.segment_bytes / (1 << 20):g}MiB"


def paired_ratios(slowest: dict[str, list[float]], impl: str) -> dict[str, float]:
    """For every other implementation: the median over iterations of this one's time
    divided by the other's in the same iteration. The implementations take turns call by
    call, so a ratio compares calls made seconds apart, and the machine's drift (which moves
    absolute times by tens of percent on a shared VM) cancels."""
    mine = slowest[impl]
    return {other: statistics.median(a / b for a, b in zip(mine, ts))
            for other, ts in slowest.items() if other != impl}


def paired_intervals(slowest: dict[str, list[float]], impl: str) -> dict[str, list]:
    """For every other implementation: this one's time over the other's, call by call, as
    ``[estimate, low, high, n]`` (:func:`ccddp.stats.paired_ratio`: Hodges-Lehmann
    estimate with its 95 % interval; low and high None with too few calls)."""
    from ccddp.stats import paired_ratio

    mine = dict(enumerate(slowest[impl]))
    out = {}
    for other, ts in slowest.items():
        if other != impl:
            iv = paired_ratio(mine, dict(enumerate(ts)))
            if iv is not None:
                out[other] = [iv.estimate, iv.low, iv.high, iv.n]
    return out


def bench(args: argparse.Namespace) -> list[dict]:
    """Time every (op, size) with the implementations taking turns: each iteration calls
    each implementation once, in ``--impl`` order, after a barrier."""
    n, rank = dist.get_world_size(), dist.get_rank()
    device = rank_device(args.device)
    dtype = DTYPES[args.dtype]
    itemsize = torch.empty(0, dtype=dtype).element_size()
    # Per-rank results (times, wrong-element counts) travel sealed on a group of their
    # own: the host must not be able to turn a wrong result into "0 wrong".
    report = SecureGroup(CommSettings(impl="secure", timeout_s=args.timeout), transport=Transport.open(None, args.timeout))
    groups = {}
    for impl in args.impl.split(","):
        settings = CommSettings(impl="secure", algorithm=args.algorithm,
                                segment_bytes=int(args.segment_mb * (1 << 20)), tag=args.tag, chains=args.chains,
                                allgather=args.allgather, timeout_s=args.timeout, placement=args.placement)
        if device.type == "cuda":
            # The engine's groups take host tensors: on a GPU every implementation is a
            # torch.distributed group, as a user's script would call it.
            domains = trust_domains_setting(args.trust_domains) if impl == BACKEND_IMPL else "rank"
            groups[impl] = _BackendGroup(settings.with_(trust_domains=domains),
                                         backend="gloo" if impl == "gloo" else "ccddp")
        elif impl == BACKEND_IMPL:
            groups[impl] = _BackendGroup(settings.with_(trust_domains=trust_domains_setting(args.trust_domains)))
        else:
            groups[impl] = open_impl(impl, settings)
    rows = []
    for op in args.ops.split(","):
        for size in args.sizes.split(","):
            numel = max(n, parse_size(size) // itemsize)
            if op in ("reduce_scatter", "all_gather"):
                numel -= numel % n
            case = _Case(op, n, rank, numel, dtype, device)
            times = {impl: [] for impl in groups}
            cpus = {impl: [] for impl in groups}
            wrong = dict.fromkeys(groups, 0)
            before = {}     # counters at the first measured call (i == warmup, always reached)
            for i in range(args.warmup + args.iters):
                for impl, g in groups.items():
                    # Ranks refill and check between barriers: with ranks sharing cores,
                    # one rank's refill or check would otherwise slow another's timed call.
                    case.fill()
                    dist.barrier()
                    if i == args.warmup:
                        before[impl] = g.counters.snapshot()
                    dt, dc = case.call(g)
                    dist.barrier()
                    w = case.wrong()
                    if i >= args.warmup:
                        times[impl].append(dt)
                        cpus[impl].append(dc)
                        wrong[impl] += w
            del case
            everyone = gather_json({impl: {"times": times[impl], "cpus": cpus[impl], "wrong": wrong[impl]}
                                    for impl in groups}, report)
            # Each call's time is its slowest rank's, as in nccl-tests.
            slowest = {impl: [max(r[impl]["times"][i] for r in everyone) for i in range(args.iters)]
                       for impl in groups}
            for impl, g in groups.items():
                rows.append(_row(args, op, impl, g, n, rank, numel, itemsize, [r[impl] for r in everyone],
                                 before[impl], paired_ratios(slowest, impl)))
                rows[-1]["paired_ratio_intervals"] = paired_intervals(slowest, impl)
                rows[-1].update(_where(device, g))
    for g in [*groups.values(), report]:
        g.close()
    return rows


def _row(args, op: str, impl: str, g: "SecureGroup | GlooReference | _BackendGroup", n: int, rank: int, numel: int, itemsize: int,
         per_rank: list[dict], before: dict, paired: dict) -> dict:
    """One table row from every rank's (authenticated) times, CPU times and wrong counts."""
    delta = CryptoCounters.diff(g.counters.snapshot(), before)
    # The median call of the slowest rank, as nccl-tests reports.
    sec = max(statistics.median(r["times"]) for r in per_rank)
    # CPU per rank (median call, mean over ranks): with every core busy, no schedule can
    # take less wall time than this.
    cpu = sum(statistics.median(r["cpus"]) for r in per_rank)
    wrong = sum(r["wrong"] for r in per_rank)
    algbw = numel * itemsize / sec / 1e9
    it = args.iters
    return {
        "op": op, "impl": impl, "bytes": numel * itemsize, "count": numel, "type": args.dtype,
        "redop": "sum" if op in ("all_reduce", "reduce_scatter") else "none",
        "world_size": n, "time_us": sec * 1e6, "algbw_gbps": algbw,
        "busbw_gbps": algbw * bus_factor(op, n), "wrong": wrong,
        "cpu_us_per_rank": cpu / n * 1e6,
        "paired_ratios": paired,
        "seals_per_rank": delta["seals"] / it, "opens_per_rank": delta["opens"] / it,
        "segments_sealed_per_rank": delta["segments_sealed"] / it,
        "segments_opened_per_rank": delta["segments_opened"] / it,
        "crypto_busy_us_per_rank": delta["busy_seconds"] / it * 1e6,
        "bytes_sealed_per_rank": delta["bytes_sealed"] / it, "bytes_opened_per_rank": delta["bytes_opened"] / it,
        "control_seals_per_rank": delta["control_seals"] / it,
        "tag_granularity": tag_granularity(g.settings),
        "settings": g.settings.as_dict(), "iters": it, "warmup": args.warmup,
        "rank": rank,
    }


def _where(device: torch.device, g) -> dict:
    """Where a row ran: the device (and GPU), the torch.distributed backend that carried
    it, and the placement and wire of its frames (CUDA tensors, CC-on only)."""
    backend = getattr(g, "backend", None) or {"gloo": "gloo", "ring": "ccddp engine, plaintext"}.get(
        g.settings.impl, "ccddp engine")
    sealed_on_cuda = device.type == "cuda" and backend == "ccddp"
    return {**describe(device), "backend": backend, "placement": g.settings.placement if sealed_on_cuda else None,
            "device_wire": g.pg.device_wire if sealed_on_cuda else None}


def build_parser(add_help: bool = True) -> argparse.ArgumentParser:
    return build_collectives_parser(add_help)


def validate(args: argparse.Namespace) -> None:
    """The arguments as ``ccddp bench collectives`` checks them, and the settings they make."""
    check_collectives(args)
    CommSettings(trust_domains=trust_domains_setting(args.trust_domains))


def main() -> None:
    args = build_parser().parse_args()
    validate(args)
    init_from_env(args.timeout)
    rows = bench(args)
    if dist.get_rank() == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"schema": SCHEMA, "machine": machine_info(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    run_worker(main)
