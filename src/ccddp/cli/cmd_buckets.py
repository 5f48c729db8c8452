"""``ccddp buckets``: DDP's gradient buckets (= all-reduce calls per iteration) per workload.

Uses DDP's own bucketing on the meta device, so even GPT2-XL answers in about a second,
and shows the paper's Fig. 6 count beside it. The default dtype is float32, the paper's
setting; pass ``--dtype bfloat16`` to see what a reduced-precision run buckets.

Example::

    ccddp buckets --workload all
    ccddp buckets --workload gpt2-xl --bucket-cap-mb 100 --json buckets.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from ccddp.errors import ConfigError

MIB = 1 << 20

SUMMARY = "DDP gradient buckets / all-reduces per iteration of a workload"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "buckets", help=SUMMARY,
        description="Compute DDP's gradient bucket assignment (torch's own code, meta "
                    "device) for the paper's workloads and compare with paper Fig. 6.")
    p.add_argument("--workload", required=True, metavar="NAME",
                   help="workload name, comma-separated names, or 'all'")
    p.add_argument("--bucket-cap-mb", type=float, default=None, metavar="X",
                   help="DDP bucket_cap_mb (default: DDP's 25 MiB with a 1 MiB first bucket)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="gradient dtype to plan for (default: float32, as in the paper)")
    p.add_argument("--order", choices=("reverse", "ready"), default="reverse",
                   help="parameter order: 'reverse' (DDP's initial assumption, default) or "
                        "'ready' (traced gradient order, what DDP rebuilds buckets from)")
    p.add_argument("--json", metavar="PATH", help="also write the rows as a JSON list")
    p.set_defaults(func=run)


def _names(text: str) -> list[str]:
    from ccddp.workloads import WORKLOADS
    from ccddp.workloads.registry import check_name

    if text.strip() == "all":
        return list(WORKLOADS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ConfigError("--workload is empty; give a name or 'all'")
    return [check_name(n) for n in names]


def rows(names: list[str], bucket_cap_mb: float | None, dtype: str,
         order: str = "reverse") -> list[dict[str, Any]]:
    """One JSON-ready dict per workload: the bucket plan plus the paper's reference."""
    from ccddp.workloads import PAPER, bucket_plan, get_workload

    out = []
    for name in names:
        plan = bucket_plan(get_workload(name), bucket_cap_mb=bucket_cap_mb, dtype=dtype, order=order)
        row = plan.to_dict()
        sizes = plan.bucket_bytes
        row.update({
            "paper_fig6_allreduces": PAPER[name]["fig6_allreduces"],
            "min_bucket_bytes": min(sizes),
            "median_bucket_bytes": int(statistics.median(sizes)),
            "max_bucket_bytes": max(sizes),
        })
        out.append(row)
    return out


def _table(data: list[dict[str, Any]], cap: float | None, dtype: str, order: str):
    from rich.table import Table

    cap_text = "DDP default: 1 MiB first, 25 MiB" if cap is None else f"{cap:g} MiB"
    t = Table(title=f"DDP gradient buckets ({dtype}, bucket cap {cap_text}, {order} order)",
              title_justify="left")
    for col in ("workload", "parameters", "gradient MiB", "buckets = all-reduces/iter",
                "bucket MiB min / median / max", "paper Fig. 6"):
        t.add_column(col, justify="left" if col == "workload" else "right")
    for r in data:
        paper = r["paper_fig6_allreduces"]
        t.add_row(
            r["workload"],
            f"{r['num_params']:,}",
            f"{r['total_bytes'] / MIB:,.1f}",
            str(r["num_buckets"]),
            f"{r['min_bucket_bytes'] / MIB:.2f} / {r['median_bucket_bytes'] / MIB:.2f} / "
            f"{r['max_bucket_bytes'] / MIB:.2f}",
            "-" if paper is None else str(paper),
        )
    return t


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    names = _names(args.workload)
    if args.bucket_cap_mb is not None and not args.bucket_cap_mb > 0:
        raise ConfigError(f"--bucket-cap-mb must be > 0, got {args.bucket_cap_mb:g}")
    print(f"ccddp buckets: building {len(names)} model{'s' * (len(names) != 1)} ({', '.join(names)}) to count "
          "DDP's gradient buckets (loads torch first)", flush=True)
    data = rows(names, args.bucket_cap_mb, args.dtype, args.order)
    console = Console()
    if not console.is_terminal:  # a pipe gets the whole table, not 80 columns
        console = Console(width=140)
    console.print(_table(data, args.bucket_cap_mb, args.dtype, args.order))
    console.print("Iteration 0 runs ONE all-reduce over all gradients; DDP rebuilds the "
                  "buckets above from iteration 1 on.")
    if args.json:
        path = Path(args.json)
        try:
            path.write_text(json.dumps(data, indent=2) + "\n")
        except OSError as e:
            raise ConfigError(f"cannot write {path}: {e.strerror or e}") from None
        console.print(f"wrote {path}")
    return 0
