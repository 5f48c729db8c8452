"""``ccddp characterize``: the paper's characterization study on this machine, with a report."""

from __future__ import annotations

import argparse
import os
import sys
import time

from ccddp.errors import ConfigError

SUMMARY = "the main job: every workload CC-off and CC-on at several world sizes; results.json, figures, report.md"
DESCRIPTION = (
    "Measure what confidential computing costs DDP training on this machine, as the paper's "
    "characterization study does: each workload runs CC-off and CC-on (the paper's naive "
    "schedule and ccddp's pipelined one) at each world size. The variants of one workload and "
    "world size take turns iteration by iteration in one launch, so every CC-on/CC-off ratio is "
    "paired and comes with a 95 % interval. Writes OUT/results.json (every iteration), figures "
    "and OUT/report.md; re-running on the same OUT resumes. --quick (3 workloads at 2 and 3 "
    "ranks) takes about 6 minutes on a quiet 2-core machine; the full study takes hours.")


def register(sub) -> None:
    from ccddp.bench.characterize import FULL, QUICK
    from ccddp.bench.options import add_device_options

    def both(key: str, fmt=lambda v: ",".join(map(str, v)) if isinstance(v, list) else str(v)) -> str:
        if QUICK[key] == FULL[key]:
            return fmt(QUICK[key])
        return f"{fmt(QUICK[key])} with --quick, else {fmt(FULL[key])}"

    p = sub.add_parser("characterize", help=SUMMARY, description=DESCRIPTION)
    p.add_argument("--out", required=True, help="output directory (re-run with the same one to resume)")
    p.add_argument("--quick", action="store_true",
                   help=f"{', '.join(QUICK['workloads'])} with small per-rank batches at "
                        f"{' and '.join(map(str, QUICK['world_sizes']))} ranks")
    p.add_argument("--workloads", default=None,
                   help=f"comma list (default: {','.join(QUICK['workloads'])} with --quick, else all "
                        f"{len(FULL['workloads'])}: {','.join(FULL['workloads'])})")
    p.add_argument("--world-sizes", default=None, help=f"comma list of ranks, each >= 2 (default: {both('world_sizes')})")
    p.add_argument("--schedules", default=None, help=f"CC-on schedules, comma list (default: {both('schedules')})")
    p.add_argument("--steps", type=int, default=None,
                   help=f"measured iterations per variant; with --budget, the fewest (default: {both('steps')})")
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help="the most measuring time per launch after its warm-up (it picks the number of "
                        "iterations; with --precision a launch can stop sooner) "
                        f"(default: {both('budget_s', lambda v: f'{v:g} s' if v else 'none, exactly --steps')})")
    p.add_argument("--precision", type=float, default=None, metavar="FRACTION",
                   help="with a budget: stop a launch once every CC-on/CC-off ratio's 95 %% interval is "
                        "within this fraction of it (0.1: ±10 %%), after the fewest iterations "
                        f"(default: {both('precision', lambda v: f'{v:g}' if v else 'none, measure the whole budget')})")
    p.add_argument("--warmup", type=int, default=None, help=f"warm-up iterations per variant (default: {both('warmup')})")
    p.add_argument("--size", default="default", choices=["default", "tiny"],
                   help="tiny: the same models with a few layers, for a fast check")
    p.add_argument("--trust-domains", default="rank", metavar="MAP",
                   help="which ranks share a trust boundary (CC-on all-reduces plaintext inside a domain, sealed "
                        "across): rank (default: every rank its own), node, or a JSON list of rank lists covering "
                        "every world size's ranks")
    add_device_options(p)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds any rank may wait on a peer")
    p.add_argument("--no-projection", action="store_true", help="skip the performance-model projections to GPUs")
    p.set_defaults(func=run)


def plan_from(args: argparse.Namespace):
    from ccddp.bench.characterize import FULL, QUICK, Plan
    from ccddp.bench.options import (WORKLOAD_NAMES, check_device_options, min_world_size,  # no torch
                                     trust_domains_setting)

    base = QUICK if args.quick else FULL
    workloads = args.workloads.split(",") if args.workloads else list(base["workloads"])
    for w in workloads:
        if w not in WORKLOAD_NAMES:
            raise ConfigError(f"unknown workload {w!r}; choose from {', '.join(WORKLOAD_NAMES)}")
    try:
        world_sizes = [int(x) for x in args.world_sizes.split(",")] if args.world_sizes else list(base["world_sizes"])
    except ValueError:
        raise ConfigError(f"--world-sizes must be integers, got {args.world_sizes!r}") from None
    check_device_options(args)
    fewest = min_world_size(args.device)
    if any(n < fewest for n in world_sizes):
        raise ConfigError(f"every world size must be >= {fewest} (CC-on needs a peer to exchange gradients with"
                          + ("; one rank runs with --device cuda)" if fewest > 1 else ")"))
    schedules = args.schedules.split(",") if args.schedules else list(base["schedules"])
    for s in schedules:
        if s not in ("naive", "pipelined"):
            raise ConfigError(f"unknown schedule {s!r}; choose naive and/or pipelined")
    steps = args.steps if args.steps is not None else base["steps"]
    warmup = args.warmup if args.warmup is not None else base["warmup"]
    budget = args.budget if args.budget is not None else base["budget_s"]
    if steps < 1 or warmup < 0:
        raise ConfigError("--steps must be >= 1 and --warmup >= 0")
    if budget is not None and (budget <= 0 or warmup < 1):
        raise ConfigError("--budget needs a positive number of seconds and --warmup >= 1 (the warm-up times it)")
    precision = args.precision if args.precision is not None else base["precision"]
    if precision is not None and not (0 < precision < 1 and budget):
        raise ConfigError("--precision is a fraction between 0 and 1 (0.1 = ±10 %) and needs a --budget")
    domains = trust_domains_setting(args.trust_domains)
    if not isinstance(domains, str):
        for n in world_sizes:
            if sorted(r for d in domains for r in d) != list(range(n)):
                raise ConfigError(f"--trust-domains {args.trust_domains} does not cover the ranks of world size {n} "
                                  "exactly once: give one world size, or use node")
    return Plan(workloads, world_sizes, schedules, steps, warmup, args.size, args.quick, budget, precision,
                args.trust_domains.strip(), args.device, args.placement)


def group_line(data: dict, plan, workload: str, ws: int) -> str:
    """What one finished launch measured, in one line: each CC-on schedule over CC-off."""
    from ccddp.report.results import Results
    from ccddp.stats import ratio_text

    res = Results(data)
    parts = []
    for s in plan.schedules:
        c = res.comparison(workload, ws, s)
        parts.append(f"{s}/off {ratio_text(c)}" if c else f"{s}/off failed")
    rounds = [len(Results.round_ms(r)) for r in res.runs
              if res.is_ok(r) and r.get("workload") == workload and r.get("world_size") == ws]
    return ", ".join(parts) + (f"; {max(rounds)} rounds" if rounds else "")


class PlainProgress:
    """One line per event, for logs, pipes and CI (no terminal to redraw a bar on).
    ``total``: the launches this session will run (known before the first starts)."""

    def __init__(self, plan, stream=None, total: int | None = None) -> None:
        self.plan, self.stream = plan, stream or sys.stdout
        self.total = total
        self.t0 = self.started = time.monotonic()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def __call__(self, done: int, total: int, workload: str, ws: int, data: dict | None) -> None:
        now = time.monotonic()
        head = f"characterize [{done + (data is None)}/{total}] {workload}, {ws} ranks:"
        if data is None:
            self.started = now
            line = f"{head} started ({_clock(now - self.t0)} elapsed)"
        else:
            line = f"{head} done in {now - self.started:.0f} s; {group_line(data, self.plan, workload, ws)}"
        print(line, file=self.stream, flush=True)


class BarProgress(PlainProgress):
    """A progress bar on a terminal, with the same one-line results printed above it."""

    def __enter__(self):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                            TimeElapsedColumn())
        self.bar.__enter__()
        self.task = self.bar.add_task("characterize: counting buckets, timing AES-GCM", total=self.total)
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def __call__(self, done: int, total: int, workload: str, ws: int, data: dict | None) -> None:
        self.bar.update(self.task, completed=done, total=total,
                        description=f"characterize: {workload}, {ws} ranks" if data is None else "characterize")
        if data is None:
            self.started = time.monotonic()
        else:
            self.bar.console.print(f"{workload}, {ws} ranks: done in {time.monotonic() - self.started:.0f} s; "
                                   f"{group_line(data, self.plan, workload, ws)}", highlight=False)


def launches_to_run(plan, out: str) -> int:
    """The launches ``--out`` still lacks of ``plan`` (all of them in a new folder)."""
    from ccddp.bench.characterize import load, pending

    data = load(os.path.join(out, "results.json"))
    return len(pending(data, plan)) if data else len(plan.workloads) * len(plan.world_sizes)


def start_line(plan, todo: int) -> str:
    """What characterize is about to do, printed before anything slow starts."""
    total = len(plan.workloads) * len(plan.world_sizes)
    left = "" if todo == total else f" ({total - todo} already in the folder)"
    return (f"ccddp characterize: {todo} launch{'' if todo == 1 else 'es'} to run{left}: "
            f"{', '.join(plan.workloads)} on {', '.join(map(str, plan.world_sizes))} ranks, CC-off and CC-on "
            f"({', '.join(plan.schedules)}) in turns; first counting each model's all-reduce buckets and timing "
            "AES-GCM on this machine")


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}:{s:02d}"


def run(args: argparse.Namespace) -> int:
    from ccddp.bench.characterize import characterize

    from ccddp.cli.preflight import check_group_secret, require_gpu_device, warn_oversubscribed

    plan = plan_from(args)
    check_group_secret()
    if plan.device == "cuda":
        require_gpu_device("ccddp characterize")   # no GPU device at all: answered before torch loads
    else:
        warn_oversubscribed(max(plan.world_sizes), "ccddp characterize", flag="--world-sizes")
    if plan.device == "cuda":
        from ccddp.bench.devices import require_cuda  # torch: after every argument is checked

        require_cuda("ccddp characterize")
    todo = launches_to_run(plan, args.out)
    print(start_line(plan, todo), flush=True)
    progress = (BarProgress if sys.stdout.isatty() else PlainProgress)(plan, total=todo)
    with progress:
        data = characterize(plan, args.out, timeout_s=args.timeout, progress=progress,
                            project=not args.no_projection)
    failed = [r for r in data["runs"] if r["status"] != "ok"]
    from ccddp.report.markdown import write_report

    report = write_report(os.path.join(args.out, "results.json"), args.out)
    print(f"report: {report}")
    print(f"results: {os.path.join(args.out, 'results.json')} ({len(data['runs']) - len(failed)} runs ok, "
          f"{len(failed)} failed)")
    for r in failed:
        print(f"  failed {r['key']}: {r['error']}")
    return 1 if failed else 0
