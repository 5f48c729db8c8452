"""Folds this session's paired runs (pair.sh and suite.sh output in RUNS) into JSON:
``python summarize.py RUNS > summary.json`` (the profile figures were added by hand from perf).
"""
import json, re, statistics as st, sys

RUNS = sys.argv[1]
out = {"machine": "2-core VM, torch 2.13.0+cpu, Python 3.11.7", "date": "2026-12-08",
       "before": "44c0da3", "after": "44c0da3 + ccddp.startup (working tree)", "pairs": {}, "suite": []}
for name, path in [("ccddp train --workload graphsage --size tiny --cc off,on --steps 6", f"{RUNS}/pair_train2.txt"),
                   ("ccddp launch --nproc-per-node 2 examples/ddp_tutorial.py --steps 3", f"{RUNS}/pair_launch.txt")]:
    r = {"before": [], "after": []}
    for line in open(path):
        p = line.split()
        if len(p) == 4 and p[0] in r:
            r[p[0]].append({"cpu_s": round(float(p[1]) + float(p[2]), 2), "wall_s": float(p[3])})
    out["pairs"][name] = {k: {"runs": v, "cpu_median_s": st.median(x["cpu_s"] for x in v),
                              "wall_median_s": st.median(x["wall_s"] for x in v)} for k, v in r.items()}
for line in open(f"{RUNS}/suite_results.txt"):
    m = re.match(r"(\w+?)(\d) (\d+) passed, (\d+) skipped.* in ([\d.]+)s .* busy ([\d.]+) idle ([\d.]+) wall ([\d.]+)", line)
    if m:
        out["suite"].append({"code": m[1], "round": int(m[2]), "passed": int(m[3]), "skipped": int(m[4]),
                             "pytest_s": float(m[5]), "machine_busy_cpu_s": float(m[6]), "idle_core_s": float(m[7]),
                             "wall_s": float(m[8])})
json.dump(out, sys.stdout, indent=1)
