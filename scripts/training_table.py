"""Print the CC-on/CC-off table of BENCHMARKS.md from training results (one JSON per run).

Usage::

    python scripts/training_table.py benchmarks/training/rounds [--json table.json]

Takes directories or files of ``ccddp train --json`` results: comparisons of variants
measured in turns (``--cc off,on``: paired ratios with 95 % intervals) or single runs,
e.g. the output of ``scripts/validation_runs.py --shapes default`` (ratios of medians,
no interval); see ``ccddp.report.training_runs``. Runs folded into a ``runs.json``
(``scripts/folded_runs.py``) are named by their original paths: ``benchmarks/training/rounds``
is every entry ``rounds/...`` of ``benchmarks/training/runs.json``.
"""

from __future__ import annotations

import argparse
import json
import sys

from folded_runs import materialize

from ccddp.errors import ConfigError
from ccddp.report.training_runs import compare_runs, markdown_table
from ccddp.runs import load_runs
from ccddp.workloads import WORKLOADS


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help="result files or directories")
    ap.add_argument("--schedules", default="naive,pipelined", help="CC-on columns (default: naive,pipelined)")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = ap.parse_args()
    try:
        with materialize(args.paths) as paths:
            rows = compare_runs(load_runs(paths), order=list(WORKLOADS))
    except ConfigError as e:
        print(f"training_table: {e}", file=sys.stderr)
        return 2
    print("\n".join(markdown_table(rows, tuple(args.schedules.split(",")))))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
