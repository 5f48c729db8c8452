#!/usr/bin/env bash
# A closer look at the one row whose estimate was above 1 (4 ranks, 1 MiB): --iters 30,
# old (/tmp/orig) and new (/tmp/new) taking turns, the order flipping every round. The
# launches' results are folded into ../runs.json at the end (scripts/folded_runs.py).
set -u
OUT=$(cd "$(dirname "$0")" && pwd)
. "$OUT/../../ab_launch.sh"
for r in $(seq 1 "${ROUNDS:-8}"); do
  if [ $((r % 2)) = 1 ]; then order="orig new"; else order="new orig"; fi
  for t in $order; do
    run coll-ws4-r$r $t python -m ccddp.cli bench collectives --world-size 4 --sizes 1M --impl gloo,secure \
        --iters 30 --warmup 5 --json "$OUT/coll-ws4-r$r-$t.json"
  done
done
echo "$(date -u +%FT%TZ) ALL DONE" >> "$OUT/log.txt"
python "$OUT/../../../scripts/folded_runs.py" fold "$OUT/.." 'ws4-1m/coll-*.json'
