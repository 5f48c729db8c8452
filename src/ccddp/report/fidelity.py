"""The model-fidelity table: the performance model beside every published number it
speaks to (``ccddp fidelity --json``, or a results file's ``fidelity``), as markdown.

Example::

    from ccddp.sim.fidelity import evaluate, summary
    rows = evaluate()
    print("\\n".join(fidelity_lines(rows, summary(rows))))
"""

from __future__ import annotations

from typing import Any


def fmt_number(x: float) -> str:
    return f"{x:.4g}" if abs(x) < 10000 else f"{x:,.0f}"


def fidelity_lines(rows: list[dict[str, Any]], summary: dict[str, Any]) -> list[str]:
    """The table of numbers, the table of trends and a one-line summary."""
    out = ["| source | where | number | published | predicted | role | error |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("role") == "trend":
            continue
        role = r["role"] + (f" ({r['fits']})" if r.get("fits") else "")
        err = f"{r['error']:+.1%}" + (" (in band)" if r.get("band") and r["error"] == 0 else "")
        out.append(f"| {r['source']} | {r['where']} | {r['what']} | {fmt_number(r['published'])} | "
                   f"{fmt_number(r['predicted'])} | {role} | {err} |")
    out += ["", "| source | where | trend | model |", "|---|---|---|---|"]
    out += [f"| {r['source']} | {r['where']} | {r['what']} | "
            f"{'holds' if r['holds'] else 'WRONG SIGN'} |" for r in rows if r.get("role") == "trend"]
    out += ["", summary_line(summary)]
    return out


def summary_line(s: dict[str, Any]) -> str:
    return (f"Held out: {s['held_out']} numbers, median absolute error "
            f"{s['held_out_median_abs_error']:.1%} ({s['held_out_times']} times and shares "
            f"only: {s['held_out_times_median_abs_error']:.1%}); {s['held_out_within_20pct']} "
            f"within 20 %. Trends: {s['trends_holding']} of {s['trends']} hold.")


__all__ = ["fidelity_lines", "summary_line", "fmt_number"]
