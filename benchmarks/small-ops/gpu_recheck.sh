#!/usr/bin/env bash
# Issue 42 on a GPU: re-measure the 4K/64K/1M CUDA rows of `ccddp bench collectives`
# (2 ranks sharing the one GPU, gloo wire) with this tree's small-op changes, and count
# the device engine's calls, launches and syncs per small all-reduce. About 2 minutes on
# an H100. From the repository root, on the GPU machine:
#
#   OUT=/some/folder bash benchmarks/small-ops/gpu_recheck.sh
#
# Writes into $OUT (default runs/small-ops-gpu): placement-device.json,
# placement-staged.json, placement-auto.json (each a `--json` of bench collectives:
# gloo and secure paired call by call, 20 measured calls per size), device-counts.json
# (benchmarks/small-ops/device_counts.py --device cuda), recheck.log. Wheels the image
# lacks are installed from .whl/ as scripts/gpu_check.sh does (CCDDP_GPU_WHEELS); each
# step is bounded by `timeout` and a failed step does not stop the next.
#
# What to compare: the session's H100 numbers before issue 42 (BENCHMARKS.md, "Small
# collectives: the fixed cost (issue 42)"): device 4.95/4.91/5.59 ms, staged
# 1.20/1.13/2.27 ms, gloo 0.64/0.61/1.06 ms at 4K/64K/1M. "auto" stages CUDA calls of at most
# 1 MiB through host (backend/calls.py _small, placement.stages_small).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
OUT=${OUT:-runs/small-ops-gpu}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/recheck.log
: >"$LOG"
WHEELS=${CCDDP_GPU_WHEELS:-.whl}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ccddp-small-ops.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
SITE=$WORK/site
shopt -s nullglob
wheels=("$WHEELS"/*.whl)
shopt -u nullglob
if ((${#wheels[@]})); then
    "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
        --only-binary=:all: --target "$SITE" "${wheels[@]}" >>"$LOG" 2>&1 || echo "wheels: install failed" | tee -a "$LOG"
fi
unset TRITON_INTERPRET
export PYTHONUNBUFFERED=1 PYTHONPATH="$SITE:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export CCDDP_GROUP_SECRET=${CCDDP_GROUP_SECRET:-$("$PY" -c 'import secrets; print(secrets.token_hex(32))')}

step() {  # name seconds command...
    local name=$1 secs=$2
    shift 2
    echo "== $name: $*" | tee -a "$LOG"
    local t0=$SECONDS
    timeout "$secs" "$@" >>"$LOG" 2>&1
    echo "== $name: exit $? after $((SECONDS - t0)) s" | tee -a "$LOG"
}

# The first placement pays Triton's compile of the kernels (cached for the others).
for placement in device staged auto; do
    step "placement-$placement" 45 "$PY" -m ccddp.cli bench collectives --device cuda --world-size 2 \
        --impl gloo,secure --sizes 4K,64K,1M --iters 20 --warmup 3 --placement "$placement" \
        --json "$OUT/placement-$placement.json"
done
step device-counts 30 "$PY" -m torch.distributed.run --nproc-per-node 2 benchmarks/small-ops/device_counts.py \
    --device cuda --size 4K --json "$OUT/device-counts.json"
grep -h "│ \(gloo\|secure\)" "$LOG" | tee "$OUT/rows.txt" || true
