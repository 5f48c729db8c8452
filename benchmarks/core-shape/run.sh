#!/usr/bin/env bash
# Issue 40, "not slower": collectives at 1 MiB and 64 MiB, 2 and 4 ranks, before (main at
# 9451641, checked out at /work/before) and after (this tree: Session/Endpoint, the channel
# split, the opened-frame buffers), the trees alternating, the order flipped every round.
# Both trees import cryptography 50.0.2 (installed with `pip install --target /tmp/c50site`):
# 9451641 opens reduced frames in place, which cryptography 51 refuses.
#   bash benchmarks/core-shape/run.sh RUNS_DIR
#   python benchmarks/small-ops/summarize.py RUNS_DIR --before before --after after --out benchmarks/core-shape/paired.json
set -u
RUNS=${1:?runs folder}
mkdir -p "$RUNS"
export CCDDP_GROUP_SECRET=$(python -c "import secrets; print(secrets.token_hex(32))")
run() {  # tree ws round
  local tree=$1 ws=$2 k=$3 root=/work/main; [ "$tree" = before ] && root=/work/before
  echo "$(date -u +%FT%TZ) $tree ws$ws round $k load $(cut -d' ' -f1 /proc/loadavg)" >> "$RUNS/log.txt"
  ( cd $root && PYTHONPATH=/tmp/c50site:$root/src timeout 600 python -m ccddp.cli bench collectives \
      --world-size $ws --sizes 1M,64M --impl gloo,secure,secure-domains --iters 20 --warmup 3 \
      --json "$RUNS/ws$ws-$tree-$k.json" ) > "$RUNS/ws$ws-$tree-$k.log" 2>&1
}
for k in 1 2 3 4; do
  if [ $((k % 2)) = 1 ]; then order="before after"; else order="after before"; fi
  for ws in 2 4; do
    for tree in $order; do run $tree $ws $k; done
  done
done
