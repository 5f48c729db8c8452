#!/usr/bin/env bash
# The engine before and after this round of work, and the backend over trust domains.
# old = 45f8dc4 (checked out at /tmp/orig), new = this commit (checked out at /tmp/new):
# launches alternate old/new, the order flipping every round; every launch's load is logged.
# The launches' results are folded into $OUT/runs.json at the end (scripts/folded_runs.py).
set -u
OUT=${OUT:-/work/main/benchmarks/engine}
RUN_LOGS="$OUT"
. "$(dirname "$0")/../ab_launch.sh"
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then order="orig new"; else order="new orig"; fi
  for ws in 2 4; do
    for t in $order; do
      run coll-ws$ws-r$r $t python -m ccddp.cli bench collectives --world-size $ws --sizes 1M,64M --impl gloo,secure \
          --iters 12 --warmup 3 --json "$OUT/coll-ws$ws-r$r-$t.json"
    done
  done
  run domains-ws4-r$r new python -m ccddp.cli bench collectives --world-size 4 --sizes 64M \
      --impl gloo,secure,secure-domains --trust-domains '[[0,1],[2,3]]' --iters 12 --warmup 3 \
      --json "$OUT/domains-ws4-r$r.json"
done
echo "$(date -u +%FT%TZ) ALL DONE" >> "$LOG"
python "$(dirname "$0")/../../scripts/folded_runs.py" fold "$OUT" 'coll-*.json' 'domains-*.json'
