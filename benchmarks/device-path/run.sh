#!/usr/bin/env bash
# The CPU path before and after a change: old checked out at /tmp/orig, new at /tmp/new;
# results in OUT. First used for CUDA tensors coming through the backend (old = 40f6a93,
# OUT = this folder); again for the ordered wire (benchmarks/ordered-wire). Launches
# alternate old/new, the order flipping every round; every launch's load is logged. The
# launches' results are folded into $OUT/runs.json at the end (scripts/folded_runs.py).
#   OUT=... ROUNDS=8 bash run.sh && python summarize.py "$OUT" "what changed"
set -u
OUT=${OUT:-/work/main/benchmarks/device-path}
ROUNDS=${ROUNDS:-6}
. "$(dirname "$0")/../ab_launch.sh"
for r in $(seq "${FIRST:-1}" "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="orig new"; else order="new orig"; fi
  for ws in 2 4; do
    for t in $order; do
      run coll-ws$ws-r$r $t python -m ccddp.cli bench collectives --world-size $ws --sizes 1M,64M --impl gloo,secure \
          --iters 12 --warmup 3 --json "$OUT/coll-ws$ws-r$r-$t.json"
    done
  done
done
echo "$(date -u +%FT%TZ) ALL DONE" >> "$LOG"
python "$(dirname "$0")/../../scripts/folded_runs.py" fold "$OUT" 'coll-*.json'
