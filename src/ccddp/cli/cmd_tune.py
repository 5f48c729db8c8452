"""``ccddp tune``: search the CC-on settings the model predicts to be cheapest.

Searches bucket cap, schedule, algorithm, segment size and chains for one workload on one
world size, inside what the profile's crypto was measured or fitted over (chains, segment
sizes) unless ``--beyond-envelope``, and reports the best setting with its predicted
slowdown against the default's (both against today's CC-off run with DDP's default
buckets), the assumed profile values the answer moves with, and its security trade-off.

Example::

    ccddp tune --profile h100-cc --workload gpt2-xl --gpus 8 --json tune.json
"""

from __future__ import annotations

import argparse

from ccddp.errors import ConfigError

MIB = 1 << 20
#: Settings predicted within this fraction of each other tie: the model does not tell
#: them apart, so tune keeps the default rather than crown one of them.
TIE = 0.005

SUMMARY = "search bucket cap, schedule, segment size and chains (performance model)"


def register(subparsers) -> None:
    from ccddp.cli.cmd_simulate import add_workload_args

    p = subparsers.add_parser(
        "tune", help=SUMMARY,
        description="Find the CC-on settings with the lowest predicted iteration time, "
                    "inside the calibrated envelope, and say what the answer assumes.")
    add_workload_args(p, many=False)
    p.add_argument("--profile", default="paper-h100",
                   help="built-in hardware profile or TOML path (default: paper-h100)")
    p.add_argument("--gpus", type=int, required=True, help="world size")
    p.add_argument("--no-group-key", action="store_true",
                   help="leave out the group-key all-gather (keep per-link keys)")
    p.add_argument("--beyond-envelope", action="store_true",
                   help="also try chains and segment sizes beyond those the profile's crypto "
                        "was measured or fitted over (the model extrapolates there)")
    p.add_argument("--wide", action="store_true",
                   help="print at the terminal's width, or off a terminal without wrapping lines "
                        "(default: at most 120 columns)")
    p.add_argument("--json", metavar="PATH", help="write the result as JSON")
    p.set_defaults(func=run)


def describe(s: dict, hw) -> str:
    """One line for a schedule's settings (``Schedule.as_dict()``)."""
    cap = "DDP default" if s["bucket_cap_mb"] is None else f"{s['bucket_cap_mb']:g} MiB"
    if s["schedule"] == "native":
        return f"native/{s['algorithm']}, buckets {cap}"
    seg = ""
    if s["schedule"] != "naive" and s["tag"] == "segment":
        seg = f", segment {s['segment_bytes'] / MIB:g} MiB"
    chains = s["chains"] if s["chains"] is not None else (hw.mac_chains or "auto")
    return f"{s['schedule']}/{s['algorithm']}, buckets {cap}{seg}, chains {chains}"


def _fields(pairs) -> str:
    return ", ".join(f"{f} ({c:.0%})" for f, c in pairs) or "none"


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from ccddp.cli.cmd_simulate import console, load_workloads, write_json
    from ccddp.sim import SCHEDULES, load_profile, tune

    if args.gpus < 2:
        raise ConfigError(f"--gpus must be >= 2 (one GPU exchanges no gradients, so there is nothing to tune), "
                          f"got {args.gpus}")
    hw = load_profile(args.profile)
    (wl,) = load_workloads(args, hw, many=False)
    schedules = tuple(s for s in SCHEDULES
                      if not (s == "group-key-allgather" and args.no_group_key))
    with console(args.wide).status(f"searching settings for {wl.name} on {args.gpus} GPUs"):
        res = tune(hw, wl, args.gpus, schedules=schedules,
                   beyond_envelope=args.beyond_envelope)
    where = "beyond the calibrated envelope" if args.beyond_envelope else \
        f"inside the calibrated envelope (chains <= {hw.envelope_chains}, segments " \
        f"{hw.envelope_min_bytes / MIB:g}-{hw.envelope_max_bytes / MIB:g} MiB)"
    t = Table(title=f"ccddp tune: {wl.name} on {args.gpus} GPUs, profile {hw.name}, {where} "
                    f"({res.evaluated} settings simulated)", title_justify="left")
    for col in ("rank", "setting", "CC-on ms", "slowdown"):
        t.add_column(col, justify="left" if col == "setting" else "right")
    ref = res.default_row["cc_off_ms"]
    for i, (s, ms) in enumerate(res.top, 1):
        t.add_row(str(i), describe(s, hw), f"{ms:.1f}", f"{ms / ref:.2f}x")
    out = console(args.wide)
    out.print(t)
    out.print("rank: settings ordered by predicted CC-on time; setting: schedule/algorithm, DDP bucket cap, "
              "pipelining segment and crypto chains; CC-on ms: one iteration, predicted; slowdown: CC-on / "
              "today's CC-off run (DDP's default buckets).", highlight=False)
    b, d = res.best_row, res.default_row
    tie = res.best != res.default and d["cc_on_ms"] <= b["cc_on_ms"] * (1 + TIE)
    out.print(f"default: {describe(res.default.as_dict(), hw)}: CC-on {d['cc_on_ms']:.1f} ms, "
              f"slowdown {d['slowdown']:.2f}x")
    if tie:
        tied = sum(ms <= b["cc_on_ms"] * (1 + TIE) for _, ms in res.top)
        out.print(f"best:    the default. The settings tie: {'all ' if tied == len(res.top) else ''}{tied} of "
                  f"the {len(res.top)} listed are within {TIE:.1%} of the fastest ({b['cc_on_ms']:.1f} ms), "
                  f"and none is predicted faster than the default by {TIE:.1%} or more; keep the default")
    else:
        out.print(f"best:    {describe(res.best.as_dict(), hw)}: CC-on {b['cc_on_ms']:.1f} ms, "
                  f"slowdown {b['slowdown']:.2f}x ({d['cc_on_ms'] / b['cc_on_ms']:.2f}x faster)")
    if res.best != res.default and not tie:
        out.print(f"the gain rests on these ASSUMED values (its change when one is halved or "
                  f"doubled): {_fields(res.rests_on)}")
    out.print(f"the predicted time rests on these ASSUMED values: {_fields(res.time_rests_on)}")
    for note in res.outside:
        out.print(f"beyond the envelope: {note}")
    if res.tradeoff and (not tie or res.best.schedule == res.default.schedule):
        out.print(f"security trade-off: {res.tradeoff}"
                  + ("; --no-group-key keeps per-link keys"
                     if res.best.schedule == "group-key-allgather" else ""))
    if args.json:
        write_json(args.json, {**res.as_dict(), "tie": tie, "chosen": "default" if tie or res.best == res.default
                               else "best"})
        print(f"wrote {args.json}")
    return 0
