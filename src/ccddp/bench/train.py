"""``ccddp train``: DDP training of a workload, CC-off and/or CC-on, timed phase by phase.

Per iteration and rank: data (synthetic batch), bounce (sealing/opening the batch, CC-on;
a plain staging copy, CC-off; CC-on also splits it into its stages -- host seal, copy to
the device, open -- as ``bounce_seal_ms``/``bounce_copy_ms``/``bounce_open_ms``, and the
result's ``bounce`` says how the path ran), forward (including the secure buffer broadcast), backward
compute (until the last bucket is handed to communication), exposed communication (from
then until backward returns with every bucket reduced), optimizer, and crypto busy time.
From backward's start until every bucket is reduced, each iteration also records the CPU
time of the rank's training thread (``backward_main_cpu_ms``: autograd's CPU backward and
DDP's bucket copies run in it) and of its whole process (``backward_process_cpu_ms``: with the
collectives' and crypto threads): on cores the ranks share, what the backward leaves of its
wall time is waiting, which the collectives' work can fill (``ccddp validate`` reads it).

With ``--device cuda`` each rank trains on ``cuda:LOCAL_RANK % GPUs`` (ranks may share a
GPU): plain ``DistributedDataParallel(model, device_ids=[gpu])`` on a ccddp group (CC-on,
placement as ``--placement`` says) or on a plaintext one (CC-off: NCCL when every rank has
a GPU of its own, gloo with CUDA tensors when ranks share one; the result says which and
why). Every phase ends with a device synchronize, so a phase is its kernels' time, not
the time the host took to queue them. One rank is a run too: CC-on then differs from
CC-off by the input's bounce path alone (sealed on the host, opened for the device).

Variants compared in one launch (``--cc off,on``) take turns: one iteration each, every
variant's model in memory at once, or -- when the models do not fit together -- a block of
iterations each, one model at a time. Every measured iteration records its round, so a
report pairs the variants' iterations of one round and the machine's drift, which moves
absolute times by tens of percent on a shared host, falls on all of them alike.
Run under torchrun (``python -m ccddp.bench.train --workload resnet50 --cc off,on``) or
through the CLI, which launches the ranks itself.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import statistics
import time

from dataclasses import dataclass

from ccddp.startup import pause_collector

pause_collector(__name__)  # run as a rank: the imports below without the cycle collector (ccddp.startup)
import torch
import torch.distributed as dist

from ccddp.bench import devices
from ccddp.bench.machine import machine_info
from ccddp.bench.options import (PHASES, PROGRESS_ENV, SCHEDULES, Variant, build_parser, check,  # noqa: F401
                                 trust_domains_setting, variant_key, workload_from)
from ccddp.bench.reference import GlooReference, ReferenceSettings
from ccddp.bench.worker import init_from_env, run_worker
from ccddp.comm import CommSettings, SecureGroup, Transport
from ccddp.comm.control import gather_json
from ccddp.crypto import derive_purpose_key
from ccddp.crypto.counters import CryptoCounters
from ccddp.bench.bounce import BouncePath, BouncePhases
from ccddp.bench.ddp import SecureDDP
from ccddp.errors import ConfigError

SCHEMA = "ccddp.train/1"
#: Several variants measured in one launch: {"schema", "machine", "runs": [one SCHEMA result each]}.
COMPARE_SCHEMA = "ccddp.train.compare/1"
#: --budget never measures more rounds than this (a tiny model would otherwise run thousands).
MAX_ROUNDS = 200
#: With --budget, progress lines after the first --steps rounds come at most this often.
PROGRESS_EVERY_S = 1.0
#: The bounce phase's stages, each recorded per iteration as ``bounce_<stage>_ms``.
BOUNCE_STAGES = ("seal", "copy", "open")


def settings_from(args: argparse.Namespace, variant: Variant) -> CommSettings | ReferenceSettings:
    """The ccddp settings of a CC-on variant; a CC-off one runs gloo's own collectives."""
    if variant.cc == "off":
        return ReferenceSettings(args.timeout)
    return CommSettings(impl=SCHEDULES[variant.schedule], segment_bytes=int(args.segment_mb * (1 << 20)),
                        chains=args.chains, tag=args.tag, timeout_s=args.timeout, placement=args.placement,
                        trust_domains=trust_domains_setting(args.trust_domains))


def param_sha256(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in module.parameters():
        h.update(p.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class RankDevice:
    """Where this rank trains, and the plaintext group CC-off variants use there.

    ``cc_off_group`` None: the default (gloo) group. The same on every rank: the backend
    is agreed before any group is made (:meth:`agree`)."""

    device: torch.device
    cc_off_group: object | None
    cc_off_backend: str
    cc_off_reason: str

    @classmethod
    def agree(cls, args: argparse.Namespace, variants: list[Variant], group) -> "RankDevice":
        """Collective: every rank calls it, after the harness group exists."""
        device = devices.rank_device(args.device)
        own_gpu = device.type == "cuda" and all(gather_from_ranks(devices.has_own_gpu(), group))
        backend, reason = devices.plaintext_backend(device, own_gpu)
        pg = None
        if backend == "nccl" and any(v.cc == "off" for v in variants):
            pg = dist.new_group(backend="nccl")
        return cls(device, pg, backend, reason)

    def ddp_options(self) -> dict:
        return {"device_ids": [self.device]} if self.device.type == "cuda" else {}

    def backend_of(self, variant: Variant) -> dict:
        """What a result records: the backend that carried the variant's collectives."""
        if variant.cc == "on":
            return {"backend": "ccddp", "backend_reason": "every collective sealed by the ccddp backend"}
        return {"backend": self.cc_off_backend, "backend_reason": self.cc_off_reason}


def rng_state(device: torch.device) -> tuple:
    """The random streams a step draws from: the host's, and the GPU's (dropout there)."""
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def set_rng_state(device: torch.device, state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def harness_group(args: argparse.Namespace, variants: list[Variant]) -> SecureGroup | GlooReference:
    """The group the ranks exchange timings and decisions on: sealed when any variant is
    CC-on (the host must not steer or read a confidential run's measurement), plaintext
    (gloo's own) for CC-off alone. Collective: every rank creates it first, before any model."""
    if any(v.cc == "on" for v in variants):
        return SecureGroup(CommSettings(impl="secure", timeout_s=args.timeout),
                           transport=Transport.open(None, args.timeout))
    return GlooReference(None, args.timeout)


def gather_from_ranks(obj, group: SecureGroup | GlooReference) -> list:
    """Every rank's ``obj`` (timings and decisions, never model data), on every rank, as
    JSON on ``group`` (never pickle). The one place this module takes data from other
    ranks outside the training's own collectives."""
    if isinstance(group, GlooReference):
        return group.gather_json(obj)
    return gather_json(obj, group)


class Trainer:
    """One variant's model, optimizer and input bounce path on this rank, and the record
    of every iteration it ran."""

    def __init__(self, args: argparse.Namespace, variant: Variant, wl, origin: float, where: RankDevice) -> None:
        self.args, self.variant, self.wl, self.origin, self.where = args, variant, wl, origin, where
        self.device = where.device
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.settings = settings_from(args, variant)
        # Every variant starts from the same parameters and sees the same batches. Built on
        # the host, then moved: the same parameters as a CPU run's, whatever the device.
        torch.manual_seed(args.seed)
        module = wl.build_model(device="cpu").to(self.device)
        # Gradients as views of DDP's buckets: no second copy of every gradient (GPT-2 sizes
        # would not fit twice on this machine); the same in both modes. secret=None: the
        # group reads the environment (shared secret or identity keys).
        on = variant.cc == "on"
        plaintext = {} if on or where.cc_off_group is None else {"process_group": where.cc_off_group}
        self.model = SecureDDP(module, cc=variant.cc, settings=self.settings if on else None, secret=None,
                               bucket_cap_mb=args.bucket_cap_mb, gradient_as_bucket_view=True,
                               **plaintext, **where.ddp_options())
        self.bounce = None
        self.bounce_description = None
        if on:
            group = self.model.secure_group
            # The group's secret: the pre-shared one, or the one agreed by key establishment.
            self.bounce = BouncePath(derive_purpose_key(group.secret, group.session_id, f"bounce/{self.rank}"),
                                     session_id=group.session_id, device=self.device)
            self.bounce_description = self.bounce.describe()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=args.lr)
        # The variant's own random streams (dropout): variants taking turns must not draw
        # from one shared stream, or their training would differ by the order of turns.
        self.rng = rng_state(self.device)
        self.iterations: list[dict] = []
        # Progress: rank 0 alone prints (one line per iteration, never one per rank).
        self.show = self.rank == 0 and os.environ.get(PROGRESS_ENV) == "1"
        self.count, self.planned, self.last_shown = 0, "", 0.0

    def step(self, step: int, round_: int | None) -> None:
        """One training iteration on the batch of ``step``; ``round_`` is the measured
        round it belongs to, ``None`` for a warm-up iteration."""
        outer = rng_state(self.device)
        set_rng_state(self.device, self.rng)
        try:
            self._step(step, round_)
        finally:
            self.rng = rng_state(self.device)
            set_rng_state(self.device, outer)
        self.count += 1
        if self.show and self._due(round_):
            it = self.iterations[-1]
            print(f"  iteration {self.count}{self.planned} {self.variant.label}"
                  f"{' (warm-up)' if round_ is None else ''}: {it['total_ms']:.1f} ms", flush=True)

    def _due(self, round_: int | None) -> bool:
        """Whether this iteration's progress line is printed: every one when the count is
        fixed (--steps); with --budget, the warm-up and the first --steps rounds, then at
        most one line a second per variant (a tiny model runs hundreds of rounds)."""
        now = time.monotonic()
        if self.args.budget is None or round_ is None or round_ < self.args.steps or \
                now - self.last_shown >= PROGRESS_EVERY_S:
            self.last_shown = now
            return True
        return False

    def _step(self, step: int, round_: int | None) -> None:
        model, bounce, state, wl = self.model, self.bounce, self.model.hook_state, self.wl
        device = self.device
        before = model.counters()
        bounce_before = bounce.counters.snapshot() if bounce else None
        stages_before = bounce.phases.snapshot() if bounce else None
        buckets_before = state.buckets
        t0 = time.perf_counter()
        batch = wl.make_batch(step, self.rank, self.world_size)
        t1 = time.perf_counter()
        # CC-off: the plain staging copy (to the device, or a host copy on CPU ranks).
        batch = bounce.receive(bounce.stage(batch)) if bounce else {k: v.to(device, copy=True) for k, v in batch.items()}
        devices.synchronize(device)
        t2 = time.perf_counter()
        loss = wl.loss(model, batch)
        devices.synchronize(device)
        t3 = time.perf_counter()
        cpu3 = time.process_time()      # the whole process: autograd, gloo and crypto threads
        main3 = time.thread_time()       # this thread: autograd's CPU backward, DDP's bucket copies
        state.last_bucket_ready = t3
        try:
            loss.backward()
        except RuntimeError:
            if model.comm_failure() is not None:
                raise model.comm_failure() from None
            raise
        devices.synchronize(device)
        t4 = time.perf_counter()
        cpu4 = time.process_time()
        main4 = time.thread_time()
        self.opt.step()
        self.opt.zero_grad(set_to_none=False)
        devices.synchronize(device)
        t5 = time.perf_counter()
        if not torch.isfinite(loss.detach()).all():
            raise ConfigError(f"loss is not finite at step {step}; lower --lr")
        after = model.counters()
        grads = CryptoCounters.diff(after["gradients"], before["gradients"])
        sync = CryptoCounters.diff(after["broadcasts"], before["broadcasts"])
        bnc = CryptoCounters.diff(bounce.counters.snapshot(), bounce_before) if bounce else None
        stages = BouncePhases.diff(bounce.phases.snapshot(), stages_before) if bounce else None
        busy = grads["busy_seconds"] + sync["busy_seconds"] + (bnc["busy_seconds"] if bnc else 0.0)
        self.iterations.append({
            "step": step, "warmup": round_ is None, "round": round_, "start_ms": (t0 - self.origin) * 1e3,
            "total_ms": (t5 - t0) * 1e3,
            "data_ms": (t1 - t0) * 1e3, "bounce_ms": (t2 - t1) * 1e3, "forward_ms": (t3 - t2) * 1e3,
            "backward_ms": (state.last_bucket_ready - t3) * 1e3, "exposed_comm_ms": (t4 - state.last_bucket_ready) * 1e3,
            "optimizer_ms": (t5 - t4) * 1e3, "crypto_busy_ms": busy * 1e3,
            "backward_process_cpu_ms": (cpu4 - cpu3) * 1e3, "backward_main_cpu_ms": (main4 - main3) * 1e3,
            "allreduce_calls": state.buckets - buckets_before,
            "seals": grads["seals"], "opens": grads["opens"], "segments_sealed": grads["segments_sealed"],
            "exchanges": grads.get("exchanges", 0),
            "broadcast_seals": sync["seals"], "broadcast_opens": sync["opens"],
            "bounce_seals": bnc["seals"] if bnc else 0, "bounce_opens": bnc["opens"] if bnc else 0,
            **{f"bounce_{stage}_ms": stages[f"{stage}_s"] * 1e3 if stages else 0.0 for stage in BOUNCE_STAGES},
            "control_seals": grads["control_seals"] + sync["control_seals"],
            "loss": float(loss.detach().float()),
        })

    def finish(self) -> str:
        """Close the variant's groups and let its model go (the record stays); returns
        the hash of its final parameters."""
        sha = param_sha256(self.model.module)
        self.model.close()
        self.model = self.opt = self.bounce = None
        return sha


def in_turns(items: list, round_: int) -> list:
    """``items`` rotated by the round, so every variant runs first, second, ... equally often."""
    k = round_ % len(items)
    return items[k:] + items[:k]


def choose_alternation(args: argparse.Namespace, variants: list[Variant], wl, group: SecureGroup,
                       device: torch.device) -> str:
    """``iteration`` when every variant's model fits in memory at once on every rank of
    this node (on a GPU: of the ranks sharing it, in its free memory), else ``block``; all
    ranks agree (the most cautious rank decides)."""
    if args.alternate != "auto" or len(variants) == 1:
        return "iteration" if args.alternate == "auto" else args.alternate
    from ccddp.bench.memory import available_bytes, estimate_bytes

    if device.type == "cuda":
        local, have = devices.describe(device)["ranks_per_gpu"], devices.free_bytes(device)
    else:
        local, have = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1), available_bytes()
    need = sum(estimate_bytes(wl, local, dist.get_world_size(), v.schedule) for v in variants)
    fits = have is None or need <= have
    return "iteration" if all(gather_from_ranks(fits, group)) else "block"


def measured_rounds(args: argparse.Namespace, round_seconds: float, group: SecureGroup) -> int:
    """--steps, or with --budget as many rounds as the budget holds at the slowest rank's
    pace (timed from the last warm-up round), at least --steps and at most MAX_ROUNDS."""
    if args.budget is None:
        return args.steps
    slowest = max(gather_from_ranks(round_seconds, group))
    return max(args.steps, min(MAX_ROUNDS, int(args.budget / max(slowest, 1e-3))))


def precise_enough(trainers: list[Trainer], precision: float, group: SecureGroup) -> bool:
    """Whether every CC-on/CC-off ratio so far (rank 0's per-round times, as the report
    pairs them) has a 95 % interval within ``precision`` of it; rank 0 decides for all.

    Stopping on the interval's width makes the interval's coverage slightly less than
    95 % (the width is looked at after every round); the least --steps rounds and the
    budget's cap keep that small."""
    decision = None
    if dist.get_rank() == 0:
        from ccddp.stats import paired_ratio

        def by_round(t: Trainer) -> dict[int, float]:
            return {it["round"]: it["total_ms"] for it in t.iterations if not it["warmup"]}

        off = next(t for t in trainers if t.variant.cc == "off")
        widths = [paired_ratio(by_round(t), by_round(off)) for t in trainers if t.variant.cc == "on"]
        decision = all(iv is not None and iv.known and iv.half_width <= precision for iv in widths)
    return bool(gather_from_ranks(decision, group)[0])


def run_in_turns(args: argparse.Namespace, variants: list[Variant], wl,
                 group: SecureGroup, where: RankDevice) -> tuple[list[Trainer], dict]:
    """Every variant alive at once; each round runs one iteration of each, in turns."""
    origin = time.perf_counter()
    trainers = [Trainer(args, v, wl, origin, where) for v in variants]
    for t in trainers:
        t.planned = f"/{args.warmup + args.steps}" if args.budget is None else ""
    last_round = 0.0
    for step in range(args.warmup):
        t0 = time.perf_counter()
        for t in trainers:
            t.step(step, None)
        last_round = time.perf_counter() - t0
    most = measured_rounds(args, last_round, group) if args.warmup else args.steps
    for t in trainers:
        t.planned = f"/{'at most ' if args.precision else ''}{args.warmup + most}"
    rounds = 0
    # Why measuring stopped, for the report: "steps" (exactly --steps asked), "precision"
    # (every ratio within --precision), "time cap" (the --budget held no more rounds) or
    # "round cap" (MAX_ROUNDS).
    stop = "steps" if args.budget is None or not args.warmup else ("round cap" if most >= MAX_ROUNDS else "time cap")
    while rounds < most:
        for t in in_turns(trainers, rounds):
            t.step(args.warmup + rounds, rounds)
        rounds += 1
        if args.precision and rounds >= args.steps and rounds < most \
                and precise_enough(trainers, args.precision, group):
            stop = "precision"
            break
    if stop != "precision" and args.precision and rounds == args.steps and rounds == most:
        stop = "steps"  # the budget held no more than the fewest rounds
    if trainers[0].show and args.budget is not None:
        why = {"precision": f"every CC-on/CC-off ratio's 95 % interval within ±{(args.precision or 0) * 100:g} %",
               "time cap": f"the --budget of {args.budget:g} s spent", "round cap": f"the cap of {MAX_ROUNDS} rounds",
               "steps": "the fewest rounds asked for"}[stop]
        print(f"  measured {rounds} rounds per variant: stopped at {why}", flush=True)
    shas = {t.variant: t.finish() for t in trainers}
    return trainers, {"alternation": "iteration", "rounds": rounds, "block": 1, "param_sha256": shas,
                      "stop": stop}


def run_in_blocks(args: argparse.Namespace, variants: list[Variant], wl,
                  where: RankDevice) -> tuple[list[Trainer], dict]:
    """One model at a time: each round builds each variant in turn, warms it up and runs
    a block of --block measured iterations."""
    rounds = -(-args.steps // args.block)
    origin = time.perf_counter()
    done: dict[Variant, Trainer] = {}
    shas: dict[Variant, str] = {}
    for r in range(rounds):
        for v in in_turns(variants, r):
            t = Trainer(args, v, wl, origin, where)
            t.count, t.planned = r * (args.warmup + args.block), f"/{rounds * (args.warmup + args.block)}"
            for step in range(args.warmup):
                t.step(step, None)
            for i in range(args.block):
                t.step(args.warmup + i, r)
            shas[v] = t.finish()
            if v in done:
                done[v].iterations += t.iterations
            else:
                done[v] = t
            # DDP's reducer and hooks hold reference cycles: without a collection the previous
            # model's parameters and gradients (GPT2-XL: 6 GB per rank) outlive it.
            del t
            gc.collect()
            dist.barrier()
    return [done[v] for v in variants], {"alternation": "block", "rounds": rounds, "block": args.block,
                                         "param_sha256": shas, "stop": "steps"}


def measure(args: argparse.Namespace, variants: list[Variant]) -> list[dict]:
    """Run every variant in turns; returns one result per variant (on every rank)."""
    wl = workload_from(args)
    group = harness_group(args, variants)
    where = RankDevice.agree(args, variants, group)
    if choose_alternation(args, variants, wl, group, where.device) == "iteration":
        trainers, how = run_in_turns(args, variants, wl, group, where)
    else:
        trainers, how = run_in_blocks(args, variants, wl, where)
    # Timings (not model data) from every rank, after the last step.
    per_rank = gather_from_ranks({t.variant.label: [it["total_ms"] for it in t.iterations] for t in trainers}, group)
    group.close()
    labels = [v.label for v in variants]
    return [result_of(args, wl, t, [r[t.variant.label] for r in per_rank], how, labels) for t in trainers]


def train(args: argparse.Namespace) -> dict:
    """The result of the one variant ``args`` names (``--cc on`` or ``off``, one schedule)."""
    variants = check(args)
    if len(variants) != 1:
        raise ConfigError(f"train() measures one variant; --cc {args.cc} --schedule {args.schedule} names "
                          f"{len(variants)}: use measure()")
    return measure(args, variants)[0]


def result_of(args: argparse.Namespace, wl, t: Trainer, per_rank: list[list[float]], how: dict,
              labels: list[str]) -> dict:
    iterations = t.iterations
    for it, *others in zip(iterations, *per_rank):
        it["slowest_rank_total_ms"] = max(others)
    measured = [it for it in iterations if not it["warmup"]]
    summary = {k: statistics.median(it[k] for it in measured)
               for k in PHASES + ("total_ms", "crypto_busy_ms", "slowest_rank_total_ms", "backward_main_cpu_ms",
                                  "backward_process_cpu_ms") + tuple(f"bounce_{s}_ms" for s in BOUNCE_STAGES)}
    steady = measured[-1]
    v = t.variant
    return {
        "schema": SCHEMA, "machine": machine_info(), "workload": wl.name, "size": args.size,
        "shapes": wl.shapes, "num_params": wl.num_params, "world_size": t.world_size, "cc": v.cc,
        "schedule": v.schedule, "variant": v.label, "settings": t.settings.as_dict(),
        # Where it ran, and which backend carried its collectives (and why that one).
        **devices.describe(t.device), **t.where.backend_of(v),
        "placement": t.settings.placement if v.cc == "on" and t.device.type == "cuda" else None,
        "bucket_cap_mb": args.bucket_cap_mb, "optimizer": f"SGD(lr={args.lr})", "steps": len(measured),
        "warmup": args.warmup,
        # How the variants of this launch took turns; a report pairs iterations of one round.
        "pairing": {"variants": labels, "alternation": how["alternation"], "rounds": how["rounds"],
                    "block": how["block"], "stop": how["stop"],
                    "precision": args.precision, "budget_s": args.budget},
        "iterations": iterations, "summary": summary,
        "allreduce_calls_per_iteration": steady["allreduce_calls"],
        "seals_per_rank": steady["seals"], "opens_per_rank": steady["opens"],
        "exchanges_per_iteration": steady.get("exchanges", 0),
        "broadcast_seals_per_iteration": steady["broadcast_seals"],
        "bounce_seals_per_iteration": steady["bounce_seals"],
        # How the input path ran (device, opener, engines; on a GPU, the note that it is the
        # study's emulation of CC's bounce buffer); None for CC-off.
        "bounce": t.bounce_description,
        "param_sha256": how["param_sha256"][v], "per_rank_total_ms": per_rank,
    }


def write_results(path: str, results: list[dict]) -> None:
    """One variant: its result; several: a COMPARE_SCHEMA file holding all of them, with a
    launch id that tells a report they were measured in turns together. Atomic."""
    if len(results) == 1:
        data = results[0]
    else:
        launch = os.urandom(8).hex()
        for r in results:
            r["pairing"]["launch"] = launch
        data = {"schema": COMPARE_SCHEMA, "machine": results[0]["machine"], "runs": results}
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(path + ".tmp", path)


def main() -> None:
    args = build_parser().parse_args()
    variants = check(args)
    init_from_env(args.timeout)
    results = measure(args, variants)
    if dist.get_rank() == 0:
        if args.json:
            write_results(args.json, results)
        for result in results:
            s = result["summary"]
            print(f"{result['workload']} {result['variant']} world={result['world_size']}: "
                  f"median {s['total_ms']:.1f} ms/iter over {result['steps']} (" +
                  ", ".join(f"{k[:-3]} {s[k]:.1f}" for k in PHASES) +
                  f", crypto busy {s['crypto_busy_ms']:.1f}) all-reduces/iter "
                  f"{result['allreduce_calls_per_iteration']} seals/rank {result['seals_per_rank']}", flush=True)


if __name__ == "__main__":
    run_worker(main)
