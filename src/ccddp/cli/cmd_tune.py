"""``ccddp tune``: search the CC-on settings the model predicts to be cheapest.

Searches bucket cap, schedule, algorithm, segment size and chains for one workload on one
world size, and reports the best setting with its predicted slowdown against the
default's (both against today's CC-off run with DDP's default buckets).

Example::

    ccddp tune --profile h100-cc --workload gpt2-xl --gpus 8 --json tune.json
"""

from __future__ import annotations

import argparse

from ccddp.errors import ConfigError

MIB = 1 << 20


def register(subparsers) -> None:
    from ccddp.cli.cmd_simulate import add_workload_args

    p = subparsers.add_parser(
        "tune", help="search bucket cap, schedule, segment size and chains (performance model)",
        description="Find the CC-on settings with the lowest predicted iteration time.")
    add_workload_args(p, many=False)
    p.add_argument("--profile", default="paper-h100",
                   help="built-in hardware profile or TOML path (default: paper-h100)")
    p.add_argument("--gpus", type=int, required=True, help="world size")
    p.add_argument("--no-group-key", action="store_true",
                   help="leave out the group-key all-gather (keep per-link keys)")
    p.add_argument("--json", metavar="PATH", help="write the result as JSON")
    p.set_defaults(func=run)


def _describe(s: dict, hw) -> str:
    cap = "DDP default" if s["bucket_cap_mb"] is None else f"{s['bucket_cap_mb']:g} MiB"
    seg = ""
    if s["schedule"] not in ("naive", "hw-link") and s["tag"] == "segment":
        seg = f", segment {s['segment_bytes'] / MIB:g} MiB"
    chains = s["chains"] if s["chains"] is not None else hw.mac_chains
    return f"{s['schedule']}/{s['algorithm']}, buckets {cap}{seg}, chains {chains}"


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from ccddp.cli.cmd_simulate import console, load_workloads, write_json
    from ccddp.sim import SCHEDULES, load_profile, tune

    if args.gpus < 1:
        raise ConfigError(f"--gpus must be >= 1, got {args.gpus}")
    hw = load_profile(args.profile)
    (wl,) = load_workloads(args, hw, many=False)
    schedules = tuple(s for s in SCHEDULES
                      if not (s == "group-key-allgather" and args.no_group_key))
    with console().status(f"searching settings for {wl.name} on {args.gpus} GPUs"):
        res = tune(hw, wl, args.gpus, schedules=schedules)
    t = Table(title=f"ccddp tune: {wl.name} on {args.gpus} GPUs, profile {hw.name} "
                    f"({res.evaluated} settings simulated)", title_justify="left")
    for col in ("rank", "setting", "CC-on ms", "slowdown"):
        t.add_column(col, justify="left" if col == "setting" else "right")
    ref = res.default_row["cc_off_ms"]
    for i, (s, ms) in enumerate(res.top, 1):
        t.add_row(str(i), _describe(s, hw), f"{ms:.1f}", f"{ms / ref:.2f}x")
    out = console()
    out.print(t)
    b, d = res.best_row, res.default_row
    out.print(f"default: {_describe(res.default.as_dict(), hw)}: CC-on {d['cc_on_ms']:.1f} ms, "
              f"slowdown {d['slowdown']:.2f}x")
    out.print(f"best:    {_describe(res.best.as_dict(), hw)}: CC-on {b['cc_on_ms']:.1f} ms, "
              f"slowdown {b['slowdown']:.2f}x ({d['cc_on_ms'] / b['cc_on_ms']:.2f}x faster)")
    if res.best.schedule == "group-key-allgather":
        out.print("note: group-key all-gather shares one key among all ranks (a compromised "
                  "rank can forge any all-gather frame); --no-group-key keeps per-link keys")
    if args.json:
        write_json(args.json, res.as_dict())
        print(f"wrote {args.json}")
    return 0
