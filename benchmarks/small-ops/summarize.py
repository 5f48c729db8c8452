"""Summarize the paired before/after runs of issue 42 into one JSON (and a markdown table).

The runs are ``ccddp bench collectives --json`` files named ``<label>-<tree>-<k>.json``:
``tree`` is ``main`` (before) or ``wt-small`` (after) -- other names with ``--before`` and
``--after`` -- and ``k`` the alternation (the trees ran alternately: before 1, after 1,
before 2, ...). Per (world size, size, impl) this keeps each
run's paired ratio to gloo (Hodges-Lehmann estimate with its 95 % interval, over the run's
call-by-call turns), its median time and, for the sealed rows, its ratio to the additive
floor; then the median over the alternations, before and after::

    python benchmarks/small-ops/summarize.py RUNS_DIR --out benchmarks/small-ops/paired.json

``breakdown.py --json`` files in the same directory, named ``breakdown-<tree>-<k>.json``,
are kept too: per path, the wall median and each stage's median, per run; and with
``--fsdp2 DIR``, ``fsdp2.py --json`` files ``fsdp2-<tree>-<k>.json`` there: per run, the
CC-on/CC-off ratio with its interval, the step medians and whether the losses agreed.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("runs")
    p.add_argument("--out", required=True)
    p.add_argument("--date", default="2026-11-27")
    p.add_argument("--machine", default="2-core shared VM (4 sessions), AES-NI")
    p.add_argument("--note", default=None, help="what before and after are")
    p.add_argument("--before", default="main", help="the before tree's name in the file names")
    p.add_argument("--after", default="wt-small", help="the after tree's name in the file names")
    p.add_argument("--fsdp2", default=None, help="a directory of fsdp2.py --json files fsdp2-<tree>-<k>.json")
    args = p.parse_args()
    cells: dict[tuple, dict] = {}
    breakdowns: dict[str, dict] = {}
    for f in sorted(Path(args.runs).glob("*.json")):
        m = re.match(rf"(.+)-({re.escape(args.before)}|{re.escape(args.after)})-(\d+)$", f.stem)
        if not m:
            continue
        tree, k = m.group(2), int(m.group(3))
        if m.group(1) == "breakdown":
            b = json.load(open(f))
            breakdowns[f"{'before' if tree == args.before else 'after'}-{k}"] = {
                path: {"wall_us_median": round(row["wall_us_median"], 1),
                       "stages_us_median": {s: round(v, 1) for s, v in row.get("stages_us_median", {}).items()}}
                for path, row in b["paths"].items()}
            continue
        for r in json.load(open(f))["rows"]:
            key = (r["world_size"], r.get("op", "all_reduce"), r["bytes"], r["impl"])
            cell = cells.setdefault(key, {"before": [], "after": []})
            iv = r.get("paired_ratio_intervals", {}).get("gloo")
            cell["before" if tree == args.before else "after"].append({
                "alternation": k, "time_us": round(r["time_us"], 1),
                "vs_gloo": None if iv is None else [round(v, 3) for v in iv[:3]],
                "vs_additive_floor": None if r.get("vs_additive_floor") is None else round(r["vs_additive_floor"], 3),
                "seals_per_rank": r["seals_per_rank"]})
    rows = []
    for (n, op, nbytes, impl), cell in sorted(cells.items()):
        row = {"world_size": n, "op": op, "bytes": nbytes, "impl": impl}
        for side in ("before", "after"):
            runs = cell[side]
            row[side] = {
                "runs": runs,
                "time_us_median": round(statistics.median(r["time_us"] for r in runs), 1) if runs else None,
                "vs_gloo_median": round(statistics.median(r["vs_gloo"][0] for r in runs), 3)
                if runs and runs[0]["vs_gloo"] else None,
                "vs_floor_median": round(statistics.median(r["vs_additive_floor"] for r in runs), 3)
                if runs and runs[0]["vs_additive_floor"] is not None else None,
            }
        rows.append(row)
    out = {"schema": "ccddp.small-ops.paired/1", "machine": args.machine, "date": args.date, "rows": rows}
    if args.note:
        out["note"] = args.note
    if breakdowns:
        out["breakdown_4k"] = dict(sorted(breakdowns.items()))
    if args.fsdp2:
        out["fsdp2"] = fsdp2_runs(Path(args.fsdp2), args.before, args.after)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print("| ranks | op | size | impl | before: time us, vs gloo (per run) | after: time us, vs gloo (per run) |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        if row["impl"] == "gloo":
            continue
        cols = []
        for side in ("before", "after"):
            s = row[side]
            per = ", ".join(f"{r['vs_gloo'][0]:.2f}" for r in s["runs"] if r["vs_gloo"])
            floor = f", floor {s['vs_floor_median']}x" if s["vs_floor_median"] is not None else ""
            cols.append(f"{s['time_us_median']} us, **{s['vs_gloo_median']}x** ({per}){floor}")
        print(f"| {row['world_size']} | {row['op']} | {row['bytes']} | {row['impl']} | {cols[0]} | {cols[1]} |")


def fsdp2_runs(where: Path, before: str, after: str) -> dict:
    """Per tree, each FSDP2 run's ccddp/gloo estimate and 95 % interval, step medians, losses."""
    out: dict[str, list] = {"before": [], "after": []}
    for f in sorted(where.glob("fsdp2-*.json")):
        m = re.match(rf"fsdp2-({re.escape(before)}|{re.escape(after)})-(\d+)$", f.stem)
        if not m:
            continue
        d = json.load(open(f))
        r = d["ratio_ccddp_over_gloo"]
        out["before" if m.group(1) == before else "after"].append({
            "alternation": int(m.group(2)), "ccddp_over_gloo": round(r["estimate"], 3),
            "interval_95": [round(r["low"], 3), round(r["high"], 3)], "pairs": r["n"],
            "step_ms_median": {k: round(v, 1) for k, v in d["step_ms_median"].items()},
            "losses_equal": d["losses_equal"], "layers": d["layers"], "width": d["width"]})
    return out


if __name__ == "__main__":
    main()
