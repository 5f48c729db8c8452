#!/usr/bin/env bash
# DDP training CC-on at 2 ranks: SecureDDP on a gradient hook (0a00a25, before the backend;
# worktree at $OLD) vs plain DDP on the ccddp backend (this tree), taking turns launch by
# launch, order alternating by round, $ROUNDS rounds per workload (FIRST=7 adds rounds 7 on). The launch is the unit:
# summary.json holds each launch's median iteration (slowest rank) and the paired ratio
# (backend / hook) over rounds, Hodges-Lehmann with its 95 % signed-rank interval.
# Needs: git worktree add --detach /tmp/old 0a00a25
set -u
cd "$(dirname "$0")/../../.."
ROOT=$PWD
OLD=${OLD:-/tmp/old}
OUT=$ROOT/benchmarks/backend/ddp-rounds
ROUNDS=${ROUNDS:-10}
FIRST=${FIRST:-1}  # to add rounds to an earlier run
export CCDDP_GROUP_SECRET=$(python -c "import secrets; print(secrets.token_hex(32))")
run() {  # workload round variant
  local src=$ROOT/src dir=$ROOT autoload=1
  [ "$3" = old ] && src=$OLD/src dir=$OLD autoload=0
  echo "$(date -u +%FT%TZ) start $1 r$2 $3 load $(cut -d' ' -f1 /proc/loadavg)" >> $OUT/log.txt
  ( cd $dir && PYTHONPATH=$src TORCH_DEVICE_BACKEND_AUTOLOAD=$autoload timeout 900 \
      python -m ccddp.cli train --workload $1 --world-size 2 --cc on --steps 6 --warmup 2 \
      --json $OUT/train-$1-r$2-$3.json ) > $OUT/train-$1-r$2-$3.log 2>&1
  echo "$(date -u +%FT%TZ) end $1 r$2 $3 rc $? load $(cut -d' ' -f1 /proc/loadavg)" >> $OUT/log.txt
}
for r in $(seq $FIRST $ROUNDS); do
  if [ $((r % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for w in bert-base resnet50; do
    for v in $order; do run $w $r $v; done
  done
done
PYTHONPATH=$ROOT/src python - "$OUT" <<'PY'
import glob, json, re, sys
from ccddp.stats import paired_ratio
out = sys.argv[1]
summary = {}
for w in ("bert-base", "resnet50"):
    per = {"old": {}, "new": {}}
    for path in glob.glob(f"{out}/train-{w}-r*-*.json"):
        r, v = re.search(r"-r(\d+)-(old|new)\.json$", path).groups()
        per[v][int(r)] = json.load(open(path))["summary"]["slowest_rank_total_ms"]
    iv = paired_ratio(per["new"], per["old"])
    summary[w] = {"hook_ms": per["old"], "backend_ms": per["new"], "ratio": iv.estimate, "low": iv.low,
                  "high": iv.high, "rounds": iv.n}
    print(f"{w}: backend / hook {iv.estimate:.3f} ({iv.low:.3f}-{iv.high:.3f}) over {iv.n} rounds")
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
PY
