"""``ccddp report DIR``: rebuild DIR/report.md and DIR/figures/* from DIR/results.json.

Nothing is measured or re-run: the report is drawn from the results file alone, so it
can be regenerated anywhere (and gives identical files each time).

Example::

    ccddp characterize --out runs/today      # writes runs/today/results.json
    ccddp report runs/today                  # runs/today/report.md, runs/today/figures/
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ccddp.errors import ConfigError

RESULTS_NAME = "results.json"


SUMMARY = "write report.md and figures from the results.json of ccddp characterize"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help=SUMMARY,
        description="Regenerate DIR/report.md and DIR/figures/*.png|svg (the paper's Figs. 6, "
                    "8a/8b, 9a/9b, 10, 11, with 95 % intervals, and model projections) from "
                    "DIR/results.json written by `ccddp characterize`. Nothing is measured again.")
    p.add_argument("dir", metavar="DIR",
                   help=f"directory holding {RESULTS_NAME} (or the path of a results file)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ccddp.report.markdown import FIGURES_DIR, write_report

    target = Path(args.dir)
    if target.is_file():  # a results file given directly: report beside it
        results, out = target, target.parent
    elif target.is_dir():
        results, out = target / RESULTS_NAME, target
    else:
        raise ConfigError(f"{target} is not a directory; give the directory `ccddp "
                          f"characterize` wrote {RESULTS_NAME} to")
    print(f"ccddp report: writing {out / 'report.md'} and its figures from {results}", flush=True)
    path = write_report(results, out)
    figures = sorted((out / FIGURES_DIR).glob("*.png")) if (out / FIGURES_DIR).is_dir() else []
    print(f"wrote {path} and {len(figures)} figures (PNG + SVG) in {out / FIGURES_DIR}")
    return 0
