#!/usr/bin/env bash
# dist.all_reduce on a ccddp group vs ccddp.comm.all_reduce, before (348c80b: every op on the
# queue's worker) and after (a waited-for op on the caller's thread), taking turns run by run.
# Needs a worktree of 348c80b at $OLD (git worktree add --detach /tmp/old348 348c80b).
# The results are folded into benchmarks/backend/runs.json at the end (scripts/folded_runs.py).
cd "$(dirname "$0")/../../.."
OLD=${OLD:-/tmp/old348}
export CCDDP_GROUP_SECRET=$(python -c 'import os;print(os.urandom(32).hex())')
for r in 1 2 3; do
  for v in old new; do
    src=$PWD/src; [ $v = old ] && src=$OLD/src
    PYTHONPATH=$src TORCH_DEVICE_BACKEND_AUTOLOAD=0 torchrun --nproc-per-node 2 scripts/backend_overhead.py \
      --sizes 1M,64M --iters 400 --json benchmarks/backend/inline/overhead-ws2-r$r-$v.json 2>&1 \
      | grep -v "^W11\|Warn\|\*\*\*\|OMP_NUM" | sed "s/^/r$r $v /"
  done
done
python scripts/folded_runs.py fold benchmarks/backend 'inline/overhead-*.json'
