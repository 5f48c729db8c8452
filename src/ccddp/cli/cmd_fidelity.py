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


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "fidelity", help="the performance model against the published numbers (fitted / "
                         "held out, with errors)",
        description="Compare the performance model with every published number it can "
                    "speak to, and say which were fitted and which are held out.")
    p.add_argument("--json", metavar="PATH", help="write the rows and the summary as JSON")
    p.add_argument("--markdown", metavar="PATH", help="write the table as markdown")
    p.set_defaults(func=run)


def _num(x: float) -> str:
    return f"{x:.4g}" if abs(x) < 10 else f"{x:,.1f}" if abs(x) < 1000 else f"{x:,.0f}"


def markdown(rows: list[dict], summary: dict) -> str:
    """The fidelity table (and trends) as GitHub markdown."""
    out = ["| source | where | number | published | predicted | role | error |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["role"] == "trend":
            continue
        role = r["role"] + (f" ({r['fits']})" if r["fits"] else "")
        err = f"{r['error']:+.1%}" + (" (in band)" if r["band"] and r["error"] == 0 else "")
        out.append(f"| {r['source']} | {r['where']} | {r['what']} | {_num(r['published'])} | "
                   f"{_num(r['predicted'])} | {role} | {err} |")
    out += ["", "| source | where | trend | model |", "|---|---|---|---|"]
    out += [f"| {r['source']} | {r['where']} | {r['what']} | "
            f"{'holds' if r['holds'] else 'WRONG SIGN'} |" for r in rows if r["role"] == "trend"]
    out += ["", f"Held out: {summary['held_out']} numbers, median absolute error "
                f"{summary['held_out_median_abs_error']:.1%} ({summary['held_out_times']} "
                f"times and shares only: {summary['held_out_times_median_abs_error']:.1%}); "
                f"{summary['held_out_within_20pct']} within 20 %. Trends: "
                f"{summary['trends_holding']} of {summary['trends']} hold."]
    return "\n".join(out) + "\n"


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from ccddp.cli.cmd_simulate import console, write_json
    from ccddp.errors import ConfigError
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
            t.add_row(r["source"], r["where"], r["what"], _num(r["published"]),
                      _num(r["predicted"]), r["role"], f"{r['error']:+.1%}")
    out = console()
    out.print(t)
    for r in rows:
        if r["role"] == "trend":
            out.print(f"trend ({r['source']}, {r['where']}): {r['what']}: "
                      f"{'holds' if r['holds'] else 'WRONG SIGN'}")
    out.print(markdown([], s).strip().splitlines()[-1])
    if args.json:
        write_json(args.json, {"schema": "ccddp.fidelity/1", "summary": s, "rows": rows})
        print(f"wrote {args.json}")
    if args.markdown:
        try:
            with open(args.markdown, "w", encoding="utf-8") as f:
                f.write(markdown(rows, s))
        except OSError as e:
            raise ConfigError(f"cannot write {args.markdown}: {e.strerror}") from None
        print(f"wrote {args.markdown}")
    return 0
