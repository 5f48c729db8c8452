#!/usr/bin/env bash
# dist.all_reduce on a ccddp group vs ccddp.comm.all_reduce at 1 MiB: before (b4904fc) and after
# the leaner synchronous path (checks memoized per dtype and reduction, no per-op lock or
# closure, a latch only for a thread that must block). One launch's ratio moves by about
# +-3 % from launch to launch, more than its own interval says, so: $ROUNDS launches of
# each, taking turns (order alternating by round), then 64 MiB once each; summary.json
# pools them. Needs a worktree of b4904fc at $OLD (git worktree add --detach /tmp/prev b4904fc).
cd "$(dirname "$0")/../../.."
OLD=${OLD:-/tmp/prev}
OUT=benchmarks/backend/lean
ROUNDS=${ROUNDS:-12}
export CCDDP_GROUP_SECRET=$(python -c 'import os;print(os.urandom(32).hex())')
run() {  # variant round size iters
  src=$PWD/src; [ $1 = old ] && src=$OLD/src
  echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg) r$2 $1 $3" >> $OUT/log.txt
  PYTHONPATH=$src torchrun --nproc-per-node 2 scripts/backend_overhead.py \
    --sizes $3 --iters $4 --json $OUT/overhead-ws2-$3-r$2-$1.json 2>&1 \
    | grep -v "^W11\|Warn\|\*\*\*\|OMP_NUM\|size" | sed "s/^/r$2 $1 /" | tee -a $OUT/log.txt
}
for r in $(seq 1 $ROUNDS); do
  if [ $((r % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for v in $order; do run $v $r 1M 400; done
done
for v in old new; do run $v 1 64M 100; done
python scripts/backend_overhead_summary.py $OUT/overhead-ws2-1M-r*-old.json --vs $OUT/overhead-ws2-1M-r*-new.json \
  --names before,after --json $OUT/summary.json | tee -a $OUT/log.txt
