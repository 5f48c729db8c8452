"""Pool several launches of ``scripts/backend_overhead.py``: one launch's ratio moves from
launch to launch by more than its own (per-call) interval says, so the launch is the
unit. Per variant: every launch's Hodges-Lehmann ratio, their median and range, and the
HL estimate over launches with its 95 % signed-rank interval; with ``--vs``, the paired
(round by round) ratio of the second variant's launch ratios to the first's.

    python scripts/backend_overhead_summary.py before-r*.json --vs after-r*.json \\
        --names before,after --json summary.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics

from ccddp.stats import hodges_lehmann_interval, paired_ratio


def launches(paths: list[str]) -> dict[str, dict[str, float]]:
    """{size: {launch: ratio}}; a launch is named by its folder and the ``-rN-`` round in
    its file's name, so two variants' launches pair up by folder and round."""
    out: dict[str, dict[str, float]] = {}
    for path in paths:
        m = re.search(r"-r(\d+)-", path)
        if m is None:
            raise SystemExit(f"{path}: no -rN- round in the file name")
        with open(path, encoding="utf-8") as f:
            rows = json.load(f)["rows"]
        for row in rows:
            out.setdefault(row["size"], {})[f"{os.path.dirname(path)}/r{m.group(1)}"] = row["ratio"]
    return out


def pooled(ratios: dict[str, float]) -> dict:
    values = list(ratios.values())
    iv = hodges_lehmann_interval([math.log(r) for r in values])
    return {"launches": len(values), "ratios": ratios, "median": statistics.median(values),
            "min": min(values), "max": max(values),
            "hl": math.exp(iv.estimate) if iv else None,
            "hl_low": math.exp(iv.low) if iv and iv.low is not None else None,
            "hl_high": math.exp(iv.high) if iv and iv.high is not None else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("first", nargs="+", help="JSON files of one variant's launches")
    p.add_argument("--vs", nargs="*", default=[], help="JSON files of a second variant, same rounds")
    p.add_argument("--names", default="first,second")
    p.add_argument("--json")
    a = p.parse_args()
    names = a.names.split(",")
    variants = {names[0]: launches(a.first)}
    if a.vs:
        variants[names[1]] = launches(a.vs)
    summary: dict = {"variants": {}, "comparison": {}}
    for name, by_size in variants.items():
        for size, ratios in by_size.items():
            s = pooled(ratios)
            summary["variants"].setdefault(name, {})[size] = s
            print(f"{name:>8} {size:>5}: {s['launches']} launches, dist/comm ratio median {s['median']:.3f} "
                  f"(range {s['min']:.3f}-{s['max']:.3f}); over launches {s['hl']:.3f} "
                  f"({s['hl_low'] or float('nan'):.3f}-{s['hl_high'] or float('nan'):.3f})")
    if a.vs:
        for size, second in variants[names[1]].items():
            iv = paired_ratio(second, variants[names[0]].get(size, {}))
            if iv is None:
                continue
            summary["comparison"][size] = {"estimate": iv.estimate, "low": iv.low, "high": iv.high, "rounds": iv.n}
            lo = f"{iv.low:.3f}" if iv.low is not None else "?"
            hi = f"{iv.high:.3f}" if iv.high is not None else "?"
            print(f"{names[1]} / {names[0]} {size:>5}: {iv.estimate:.3f} ({lo}-{hi}) over {iv.n} rounds")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
