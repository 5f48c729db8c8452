"""Print the collectives table of BENCHMARKS.md from repeated benchmark runs.

Usage::

    python scripts/collectives_table.py benchmarks/collectives/interleaved [--json table.json]

Takes directories or files of ``ccddp bench collectives --json`` results (one per run);
see ``ccddp.report.collective_runs``. Runs folded into a ``runs.json`` (``scripts/folded_runs.py``)
are named by their original paths: ``benchmarks/collectives/interleaved`` is every entry
``interleaved/...`` of ``benchmarks/collectives/runs.json``.
"""

from __future__ import annotations

import argparse
import json
import sys

from folded_runs import materialize

from ccddp.errors import ConfigError
from ccddp.report.collective_runs import load_results, markdown_table, summarize


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help="result files or directories")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = ap.parse_args()
    try:
        with materialize(args.paths) as paths:
            rows = summarize(load_results(paths))
    except ConfigError as e:
        print(f"collectives_table: {e}", file=sys.stderr)
        return 2
    rows.sort(key=lambda r: (r["op"], r["world_size"], r["bytes"]))
    print("\n".join(markdown_table(rows)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
