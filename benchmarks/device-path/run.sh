#!/usr/bin/env bash
# The CPU path before and after a change: old checked out at /tmp/orig, new at /tmp/new;
# results in OUT. First used for CUDA tensors coming through the backend (old = 40f6a93,
# OUT = this folder); again for the ordered wire (benchmarks/ordered-wire). Launches
# alternate old/new, the order flipping every round; every launch's load is logged.
#   OUT=... ROUNDS=8 bash run.sh && python summarize.py "$OUT" "what changed"
set -u
OUT=${OUT:-/work/main/benchmarks/device-path}
LOG=$OUT/log.txt
ROUNDS=${ROUNDS:-6}
mkdir -p "$OUT"
export CCDDP_GROUP_SECRET=$(python -c "import secrets; print(secrets.token_hex(32))")
run() {  # name tree cmd...
  local name=$1 tree=$2; shift 2
  echo "$(date -u +%FT%TZ) start $name $tree load $(cut -d' ' -f1 /proc/loadavg)" >> "$LOG"
  ( cd /tmp/$tree && PYTHONPATH=/tmp/$tree/src timeout 900 "$@" ) > "/tmp/$name-$tree.log" 2>&1
  echo "$(date -u +%FT%TZ) end $name $tree rc $? load $(cut -d' ' -f1 /proc/loadavg)" >> "$LOG"
}
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
