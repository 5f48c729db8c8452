#!/bin/bash
# The whole suite once, with the machine's busy CPU over it (/proc/stat):
#   OUT=/tmp/runs bash suite.sh NAME TREE [PYTHONPATH]
# prints "NAME <pytest's last line> busy CPU_S idle CORE_S wall WALL_S".
OUT=${OUT:-/tmp}
cd "$2" || exit 2
head -1 /proc/stat > "$OUT/st0_$1"; t0=$(date +%s.%N)
env ${3:+PYTHONPATH=$3} timeout 1500 python -m pytest -q -n auto -p no:cacheprovider > "$OUT/suite_$1.log" 2>&1
t1=$(date +%s.%N); head -1 /proc/stat > "$OUT/st1_$1"
python3 - "$OUT" "$1" "$t0" "$t1" <<'PY'
import sys
out, n, t0, t1 = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
a = [int(x) for x in open(f"{out}/st0_{n}").read().split()[1:]]
b = [int(x) for x in open(f"{out}/st1_{n}").read().split()[1:]]
d = [y - x for x, y in zip(a, b)]
last = open(f"{out}/suite_{n}.log").read().strip().splitlines()[-1]
print(n, last, "busy", round((sum(d) - d[3] - d[4]) / 100, 1), "idle", round(d[3] / 100, 1), "wall", round(t1 - t0, 1))
PY
