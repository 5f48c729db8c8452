"""``ccddp characterize``: reproduce the paper's characterization here, with a report."""

from __future__ import annotations

import argparse
import os

from ccddp.errors import ConfigError


def register(sub) -> None:
    p = sub.add_parser("characterize", help="run every workload CC-off/CC-on at several world sizes; write "
                                            "results.json, figures and report.md")
    p.add_argument("--workloads", default=None, help="comma list (default: quick set, or all seven)")
    p.add_argument("--world-sizes", default=None, help="comma list, e.g. 2,3,4")
    p.add_argument("--schedules", default=None, help="CC-on schedules: naive,pipelined")
    p.add_argument("--steps", type=int, default=None, help="measured iterations per run")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--size", default="default", choices=["default", "tiny"])
    p.add_argument("--quick", action="store_true", help="3 workloads, world sizes 2,3, 2 steps: minutes")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds any rank may wait on a peer")
    p.add_argument("--no-projection", action="store_true", help="skip the performance-model projections")
    p.add_argument("--out", required=True, help="output directory (re-run to resume)")
    p.set_defaults(func=run)


def plan_from(args: argparse.Namespace):
    from ccddp.bench.characterize import FULL, QUICK, Plan
    from ccddp.workloads import WORKLOADS

    base = QUICK if args.quick else FULL
    workloads = args.workloads.split(",") if args.workloads else list(base["workloads"])
    for w in workloads:
        if w not in WORKLOADS:
            raise ConfigError(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    try:
        world_sizes = [int(x) for x in args.world_sizes.split(",")] if args.world_sizes else list(base["world_sizes"])
    except ValueError:
        raise ConfigError(f"--world-sizes must be integers, got {args.world_sizes!r}") from None
    if any(n < 2 for n in world_sizes):
        raise ConfigError("every world size must be >= 2 (CC-on needs a peer)")
    schedules = args.schedules.split(",") if args.schedules else list(base["schedules"])
    for s in schedules:
        if s not in ("naive", "pipelined"):
            raise ConfigError(f"unknown schedule {s!r}; choose naive and/or pipelined")
    steps = args.steps if args.steps is not None else base["steps"]
    warmup = args.warmup if args.warmup is not None else base["warmup"]
    if steps < 1 or warmup < 0:
        raise ConfigError("--steps must be >= 1 and --warmup >= 0")
    return Plan(workloads, world_sizes, schedules, steps, warmup, args.size, args.quick)


def run(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ccddp.bench.characterize import characterize

    plan = plan_from(args)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn()) as bar:
        task = bar.add_task("characterize", total=None)

        def progress(i, total, what):
            bar.update(task, completed=i, total=total, description=f"characterize: {what}")

        data = characterize(plan, args.out, timeout_s=args.timeout, progress=progress,
                            project=not args.no_projection)
    failed = [r for r in data["runs"] if r["status"] != "ok"]
    try:
        from ccddp.report.markdown import write_report
    except ImportError:
        write_report = None
    if write_report is not None:
        report = write_report(os.path.join(args.out, "results.json"), args.out)
        print(f"report: {report}")
    print(f"results: {os.path.join(args.out, 'results.json')} ({len(data['runs']) - len(failed)} runs ok, "
          f"{len(failed)} failed)")
    for r in failed:
        print(f"  failed {r['key']}: {r['error']}")
    return 1 if failed else 0
