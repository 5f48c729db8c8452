"""``ccddp fidelity``: the performance model against every published number it speaks to.

Lists each number of the characterization paper (the emulated H100s, profile
``paper-h100``) and of the production CC measurements (Hopper and Blackwell CC, profiles
``h200-cc`` / ``b300-cc``) beside the model's prediction: fitted (a profile constant was
solved from it), input (a workload's compute time, or a measurement used as a value) or
held out (predicted), with the error, and every published trend with whether the model
follows it.

Example::

    ccddp fidelity --json fidelity.json --markdown fidelity.md
"""

from __future__ import annotations

import argparse

SUMMARY = "the performance model against the published numbers (fitted / held out, with errors)"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "fidelity", help=SUMMARY,
        description="Compare the performance model with every published number it can "
                    "speak to, and say which were fitted and which are held out.")
    p.add_argument("--json", metavar="PATH", help="write the rows and the summary as JSON")
    p.add_argument("--markdown", metavar="PATH", help="write the table as markdown")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from ccddp.cli.cmd_simulate import console, write_json
    from ccddp.errors import ConfigError
    from ccddp.report.fidelity import fmt_number, fidelity_lines, summary_line
    from ccddp.sim.fidelity import evaluate, summary

    rows = evaluate()
    s = summary(rows)
    t = Table(title="ccddp fidelity: the model against the published numbers",
              title_justify="left")
    for col in ("source", "where", "number", "published", "predicted", "role", "error"):
        t.add_column(col, justify="right" if col in ("published", "predicted", "error")
                     else "left")
    for r in rows:
        if r["role"] != "trend":
            t.add_row(r["source"], r["where"], r["what"], fmt_number(r["published"]),
                      fmt_number(r["predicted"]), r["role"], f"{r['error']:+.1%}")
    out = console()
    out.print(t)
    for r in rows:
        if r["role"] == "trend":
            out.print(f"trend ({r['source']}, {r['where']}): {r['what']}: "
                      f"{'holds' if r['holds'] else 'WRONG SIGN'}")
    out.print(summary_line(s))
    if args.json:
        write_json(args.json, {"schema": "ccddp.fidelity/1", "summary": s, "rows": rows})
        print(f"wrote {args.json}")
    if args.markdown:
        try:
            with open(args.markdown, "w", encoding="utf-8") as f:
                f.write("\n".join(fidelity_lines(rows, s)) + "\n")
        except OSError as e:
            raise ConfigError(f"cannot write {args.markdown}: {e.strerror}") from None
        print(f"wrote {args.markdown}")
    return 0
