#!/usr/bin/env bash
# Quiet-machine A/B: old = 0a00a25 (/tmp/old), new = main (/work/main). Interleaved, order alternating by round.
# The results are folded into $OUT/runs.json at the end (scripts/folded_runs.py).
set -u
cd /work/main
OUT=benchmarks/before-after
mkdir -p $OUT
LOG=$OUT/log.txt
export CCDDP_GROUP_SECRET=$(python -c "import secrets; print(secrets.token_hex(32))")
run() {  # name variant cmd...
  local name=$1 variant=$2; shift 2
  local src=/work/main/src; [ "$variant" = old ] && src=/tmp/old/src
  echo "$(date -u +%FT%TZ) start $name $variant load $(cut -d' ' -f1 /proc/loadavg)" >> $LOG
  ( cd $( [ "$variant" = old ] && echo /tmp/old || echo /work/main ) && PYTHONPATH=$src TORCH_DEVICE_BACKEND_AUTOLOAD=$( [ "$variant" = old ] && echo 0 || echo 1 ) timeout 900 "$@" ) > $OUT/$name-$variant.log 2>&1
  echo "$(date -u +%FT%TZ) end $name $variant rc $? load $(cut -d' ' -f1 /proc/loadavg)" >> $LOG
}
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for v in $order; do
    run setup-ws2-r$r $v torchrun --nproc-per-node 2 /work/main/scripts/setup_time.py --groups 20 --json $OUT/setup-ws2-r$r-$v.json
  done
  for v in $order; do
    run coll-ws2-r$r $v ccddp bench collectives --world-size 2 --sizes 1M,64M --impl gloo,secure --iters 40 --warmup 5 --json $OUT/coll-ws2-r$r-$v.json
  done
done
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for w in bert-base resnet50; do
    for v in $order; do
      run train-$w-r$r $v ccddp train --workload $w --world-size 2 --cc on --steps 5 --warmup 2 --json $OUT/train-$w-r$r-$v.json
    done
  done
done
run overhead-ws2 new torchrun --nproc-per-node 2 /work/main/scripts/backend_overhead.py --sizes 1M,64M --iters 60 --json $OUT/backend-overhead-ws2.json
echo "$(date -u +%FT%TZ) ALL DONE" >> $LOG
python scripts/folded_runs.py fold $OUT 'coll-*.json' 'setup-*.json' 'train-*.json'
