"""Print the CC-on/CC-off ratios of one or more ``ccddp characterize`` runs side by side:
each with its 95 % interval and half-width, and whether the runs agree (their intervals
overlap). The table BENCHMARKS.md shows for repeated ``--quick`` runs.

Usage::

    python scripts/characterize_table.py benchmarks/characterize/quick-r1 benchmarks/characterize/quick-r2
"""

from __future__ import annotations

import argparse
import os
import sys

from ccddp.errors import ConfigError
from ccddp.report.results import Results
from ccddp.stats import ratio_text


def rows(results: list[Results]) -> list[list[str]]:
    out = []
    first = results[0]
    for w in first.workloads:
        for n in first.world_sizes:
            for s in first.schedules:
                cs = [r.comparison(w, n, s) for r in results]
                if all(c is None for c in cs):
                    continue
                cells = [w, str(n), s]
                for c in cs:
                    hw = c.half_width if c is not None else None
                    cells += [ratio_text(c), "-" if hw is None else f"±{hw:.0%}", str(c.n) if c else "-"]
                known = [c for c in cs if c is not None and c.known]
                if len(known) == len(cs) > 1:
                    agree = max(c.low for c in known) <= min(c.high for c in known)
                    cells.append("yes" if agree else "**no**")
                elif len(cs) > 1:
                    cells.append("-")
                out.append(cells)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", help="characterize output directories (or results.json files)")
    args = ap.parse_args()
    try:
        results = [Results.load(os.path.join(d, "results.json") if os.path.isdir(d) else d) for d in args.dirs]
    except ConfigError as e:
        print(f"characterize_table: {e}", file=sys.stderr)
        return 2
    head = ["workload", "ranks", "schedule"]
    for i in range(len(results)):
        head += [f"run {i + 1}: CC-on / CC-off", "half-width", "rounds"]
    if len(results) > 1:
        head.append("intervals overlap")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for cells in rows(results):
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
