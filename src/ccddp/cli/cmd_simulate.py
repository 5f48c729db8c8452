"""``ccddp simulate``: predict CC-off vs CC-on iteration time with the performance model.

The model (``ccddp.sim``) never imports torch, and neither does this command: the paper's
workloads come from the table shipped with ccddp (DDP's real bucket plans and per-parameter
sizes, generated from the model definitions), or from a workload profile JSON written
from a measured run.

Example::

    ccddp simulate --profile paper-h100 --workload all --gpus 2,4,8 --schedule naive
    ccddp simulate --profile h100-cc --workload gpt2-xl --gpus 8,64,1024 --json out.json
    ccddp simulate --workload all --gpus 1024 --schedule naive,pipelined
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ccddp.cli import VerbatimHelpFormatter
from ccddp.errors import ConfigError

MIB = 1 << 20
WORKLOAD_NAMES = ("graphsage", "resnet50", "resnet101", "bert-base", "bert-large",
                  "gpt2-large", "gpt2-xl")

EPILOG = """\
profiles: paper-h100 (the paper's emulation: software AES-GCM on every NVLink hop),
h100-cc, h200-cc (Hopper CC as in production: NVLink fenced in plaintext, tolls), b300-cc
(Blackwell CC: NVLink encrypted in hardware, multicast off), local (a CPU host), or a path
to a TOML profile (e.g. written by `ccddp calibrate --out PATH`).

schedules: native (the CC system's own protection: the library's all-reduce inside the
node; only for profiles whose device link is fenced or encrypted), naive (the paper's:
seal a whole chunk, send, open), pipelined (ccddp's secure collectives), group-key-allgather.
Default: native where the profile allows it, else pipelined.

breakdown columns (ms per iteration, CC on): fwd, bwd; comm = exposed communication
without its crypto; crypto = the exposed share due to AES-GCM; bounce = input sealing and
bounce-buffer copy; opt = optimizer; launch = what CC adds to kernel launches; data =
data loading and input copy. comm and crypto include backward time lost to communication
work sharing the cores/SMs. --wide adds ops/AR (seal + open operations per all-reduce
call) and AR (all-reduce calls per iteration). Every column is explained under the table.
"""


def add_workload_args(p: argparse.ArgumentParser, *, many: bool) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    what = "workload name, comma list, or 'all'" if many else "workload name"
    g.add_argument("--workload", help=f"{what} ({', '.join(WORKLOAD_NAMES)})")
    g.add_argument("--workload-profile", metavar="PATH",
                   help="JSON workload profile: {name, bucket_bytes, forward_ms, backward_ms, "
                        "optimizer_ms, input_bytes}, e.g. from a measured run")


def add_schedule_args(p: argparse.ArgumentParser) -> None:
    from ccddp.sim.schedule import ALGORITHMS, SCHEDULES, TAGS

    p.add_argument("--profile", default="paper-h100",
                   help="built-in hardware profile or TOML path (default: paper-h100)")
    p.add_argument("--schedule", default=None, metavar="NAME[,NAME]",
                   help=f"CC-on all-reduce schedule(s), comma list of {', '.join(SCHEDULES)} "
                        "(default: the profile's native protection where it has one, else "
                        "pipelined, ccddp's 'secure')")
    p.add_argument("--algorithm", choices=ALGORITHMS, default="ring",
                   help="all-reduce algorithm the schedule runs")
    p.add_argument("--bucket-cap-mb", type=float, default=None,
                   help="DDP bucket_cap_mb (default: DDP's 25 MiB with a 1 MiB first bucket)")
    p.add_argument("--segment-mb", type=float, default=4.0,
                   help="pipelining segment size in MiB (default: 4, as the secure collectives use)")
    p.add_argument("--chains", type=int, default=None,
                   help="MAC chains / crypto threads (default: the profile's mac_chains)")
    p.add_argument("--tag", choices=TAGS, default="segment",
                   help="one tag per segment, or per chunk message")
    p.add_argument("--mac-batch", type=int, default=1,
                   help="segments per tag (batched MAC; model only)")
    p.add_argument("--pad-budget-mb", type=float, default=0.0,
                   help="pre-computed pad bytes per peer in MiB (0 = off)")

SUMMARY = "predict CC-off vs CC-on iteration time (performance model)"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate", help=SUMMARY,
        description="Predict per-iteration time of DDP training with CC off and on, "
                    "decomposed like paper Figs. 8b/9b, from a hardware profile.",
        epilog=EPILOG, formatter_class=VerbatimHelpFormatter)
    add_workload_args(p, many=True)
    p.add_argument("--gpus", default="2,4,8", help="comma list of world sizes (default: 2,4,8)")
    add_schedule_args(p)
    p.add_argument("--wide", action="store_true",
                   help="every column (ops/AR, AR) at the terminal's width, or off a terminal the table's "
                        "natural width (default: at most 120 columns)")
    p.add_argument("--json", metavar="PATH", help="write the rows as a JSON list")
    p.set_defaults(func=run)


def parse_gpus(text: str) -> list[int]:
    try:
        gpus = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--gpus must be a comma list of integers, got {text!r}") from None
    if not gpus or any(g < 2 for g in gpus):
        raise ConfigError(f"--gpus needs world sizes >= 2 (one GPU exchanges no gradients, so there is nothing "
                          f"to seal), got {text!r}")
    return gpus


def schedules_from_args(args: argparse.Namespace, hw) -> list:
    """The schedules ``--schedule`` names (one or a comma list), with the other options."""
    from ccddp.sim.schedule import SCHEDULES, Schedule

    if not args.segment_mb > 0 or not args.pad_budget_mb >= 0:
        raise ConfigError("--segment-mb must be > 0 and --pad-budget-mb >= 0")
    names = [s.strip() for s in (args.schedule or "").split(",") if s.strip()] or \
        [Schedule.default_for(hw).schedule]
    for name in names:
        if name not in SCHEDULES:
            raise ConfigError(f"unknown schedule {name!r}; choose from {', '.join(SCHEDULES)}")
    return [Schedule(schedule=name, algorithm=args.algorithm,
                     bucket_cap_mb=args.bucket_cap_mb,
                     segment_bytes=int(args.segment_mb * MIB), chains=args.chains,
                     tag=args.tag, mac_batch=args.mac_batch,
                     pad_budget_bytes=args.pad_budget_mb * MIB) for name in names]


def workload_names(text: str) -> list[str]:
    names = list(WORKLOAD_NAMES) if text.strip() == "all" else \
        [w.strip() for w in text.split(",") if w.strip()]
    for n in names:
        if n not in WORKLOAD_NAMES:
            raise ConfigError(f"unknown workload {n!r}; choose from {', '.join(WORKLOAD_NAMES)}"
                              " or 'all'")
    return names


def load_workloads(args: argparse.Namespace, hw, *, many: bool = True) -> list:
    from ccddp.sim.catalog import catalog_workload
    from ccddp.sim.workload import load_workload_profile

    if args.workload_profile:
        return [load_workload_profile(args.workload_profile)]
    names = workload_names(args.workload)
    if not many and len(names) != 1:
        raise ConfigError("give exactly one workload")
    return [catalog_workload(n, hw) for n in names]


def _fmt(v: float) -> str:
    return f"{v:.1f}" if v < 100 else f"{v:.0f}"


def console(wide: bool = False):
    """stdout console: at most 120 columns (fewer on a narrower terminal); ``wide``: the
    terminal's width, or off a terminal 200 columns (rich's default would be 80)."""
    from rich.console import Console

    from ccddp.report.tables import COMPACT_WIDTH

    c = Console()
    if wide:
        return c if c.is_terminal else Console(width=200)
    return Console(width=min(c.width, COMPACT_WIDTH)) if c.is_terminal else Console(width=COMPACT_WIDTH)


#: What every column of the simulate table is, printed once under the tables.
COLUMN_NOTES = (
    "CC-off ms, CC-on ms: one training iteration, predicted; slowdown: CC-on / CC-off. "
    "fwd .. data: the CC-on iteration by phase, ms, summing to CC-on ms: fwd forward, bwd backward, "
    "comm exposed all-reduce time without its crypto (link tolls included), crypto what AES-GCM sealing "
    "and opening add to it, bounce the input's sealing and bounce-buffer copy, opt optimizer step, "
    "launch what CC adds to kernel launches, data data loading and input copy. GPUs: world size "
    "(Nn: over N nodes).")
WIDE_NOTE = "ops/AR: seal + open operations per all-reduce call; AR: all-reduce calls per iteration."


def rows_table(rows: list[dict], title: str, wide: bool = False):
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    cols = ("workload", "GPUs", "CC-off ms", "CC-on ms", "slowdown", "fwd", "bwd",
            "comm", "crypto", "bounce", "opt", "launch", "data") + (("ops/AR", "AR") if wide else ())
    for col in cols:
        t.add_column(col, justify="left" if col == "workload" else "right", overflow="fold")
    for r in rows:
        b = r["breakdown"]
        cells = [r["workload"], f"{r['gpus']}" + (f" ({r['nodes']}n)" if r["nodes"] > 1 else ""),
                 _fmt(r["cc_off_ms"]), _fmt(r["cc_on_ms"]), f"{r['slowdown']:.2f}x",
                 _fmt(b["forward"]), _fmt(b["backward"]), _fmt(b["comm"]), _fmt(b["crypto"]),
                 _fmt(b["bounce"]), _fmt(b["optimizer"]), _fmt(b["launch"]), _fmt(b["data"] + b["input"])]
        if wide:
            cells += [f"{r['ops']['ops_per_allreduce']:.0f}", str(r["ops"]["allreduces"])]
        t.add_row(*cells)
    return t


def unsealed_slowdown_note(rows: list[dict]) -> str | None:
    """Why a row shows crypto 0 beside a slowdown, when one does: nothing is sealed in
    software there, and the slowdown is CC's own cost (launch, bounce, link tolls)."""
    hit = [r for r in rows if r["breakdown"]["crypto"] < 0.05 and r["slowdown"] > 1.005]
    if not hit:
        return None
    where = ", ".join(dict.fromkeys(f"{r['profile']} {r['schedule']} at {r['gpus']} GPUs" for r in hit))
    return (f"crypto 0 beside a slowdown ({where}): nothing is sealed in software there (with NVIDIA CC the GPUs "
            "of a node share one fenced trust domain and the link carries plaintext inside it), so the slowdown "
            "is CC's own cost: slower kernel launches (launch), the input's bounce buffer (bounce) and the "
            "per-exchange link tolls (in comm).")


def write_json(path: str, data: Any) -> None:
    try:
        Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot write {path}: {e.strerror}") from None


def run(args: argparse.Namespace) -> int:
    from ccddp.sim import load_profile, sweep
    from ccddp.sim.envelope import outside_envelope

    hw = load_profile(args.profile)
    scheds = schedules_from_args(args, hw)
    gpus = parse_gpus(args.gpus)
    workloads = load_workloads(args, hw)
    out, rows = console(args.wide), []
    for sched in scheds:
        part = sweep(hw, workloads, sched, gpus)
        rows += part
        chains = f", chains {sched.chains_for(hw, max(gpus))}" if sched.sealed else ""
        title = (f"ccddp simulate: profile {hw.name}, schedule {sched.schedule}/"
                 f"{sched.algorithm}{chains}, buckets "
                 f"{'DDP default' if sched.bucket_cap_mb is None else f'{sched.bucket_cap_mb:g} MiB'}"
                 + (f", segment {args.segment_mb:g} MiB" if sched.segmented else ""))
        out.print(rows_table(part, title, wide=args.wide))
        for note in outside_envelope(hw, sched, max(gpus)):
            out.print(f"note: {note}")
    out.print(COLUMN_NOTES + (" " + WIDE_NOTE if args.wide else " --wide adds ops/AR and AR."), highlight=False)
    why = unsealed_slowdown_note(rows)
    if why:
        out.print(why, highlight=False)
    if args.json:
        write_json(args.json, rows)
        print(f"wrote {args.json}")
    return 0
