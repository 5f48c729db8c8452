#!/usr/bin/env bash
# The compatibility tier: the conformance selection on the torch of one environment.
#   bash scripts/torch_compat.sh VENV [OUT]
# VENV is a virtual environment with that torch and ccddp's test dependencies (cryptography,
# numpy, pytest, pytest-timeout, hypothesis, expecttest, rich for the self-test's table, and
# setuptools>=68 for the editable install). The script installs this checkout into it (editable, without dependencies: the
# "torch.backends" entry point that registers "ccddp" at `import torch` comes with it), so
# one checkout is tested against several torches. Writes OUT/<step>.log and
# OUT/summary.txt (one line a step: passed/FAILED, seconds, pytest's closing line) and
# exits non-zero if a step failed.
#
# The steps, each against gloo's results in the same run:
#   compat     tests/test_torch_compat.py: the private torch names, the supported range,
#              per-device registration, batch_isend_irecv and a 2-stage pipelining
#              schedule, plaintext groups refused, timeouts, monitored_barrier
#   ops        tests/test_backend.py: every c10d op at world size 3, tampering, async works
#   tools      tests/test_backend_tools.py: DDP (its options, bf16, sampler), Join, ZeRO,
#              torch.compile, comm hooks, FSDP2, object collectives; no model byte on the wire
#   subgroups  tests/test_safe_launch.py -k "gloo_group or one_rank": library subgroups
#              (new_group, new_subgroups, device mesh, distributed checkpoint), world size 1
#   suite      tests/test_conformance_subset.py: a slice of PyTorch's own backend suite
#   gated      the tests PyTorch's suite runs on gloo only (barrier timeouts, monitored
#              barriers, batched send/recv), on ccddp through the interceptor
#              (scripts/torch_conformance_gated.py); the sparse all-reduce tests are
#              left out: refused by design (README)
#   selftest   ccddp selftest --world-size 2: every attack of the adversarial link
# A CUDA build of torch (several GB) runs its CPU paths here; it is the developer's tier
# to run before stopping when the backend changes (README, "Torch releases").
set -uo pipefail
cd "$(dirname "$0")/.."
VENV="${1:?usage: bash scripts/torch_compat.sh VENV [OUT]}"
PY="$VENV/bin/python"
[ -x "$PY" ] || { echo "no python in $VENV" >&2; exit 2; }
VERSION="$("$PY" -c 'import torch; print(torch.__version__)')" || exit 2
OUT="${2:-runs/torch-compat/$VERSION}"
mkdir -p "$OUT"
# NO_INSTALL=1: an environment where ccddp is installed already (its entry point registers
# "ccddp"); PYTHONPATH=src still makes this checkout's code the one that runs.
if [ -z "${NO_INSTALL:-}" ]; then
    "$PY" -m pip install --quiet --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 \
        || { echo "cannot install this checkout into $VENV (see $OUT/install.log)" >&2; exit 2; }
fi
export PYTHONPATH="$PWD/src" OMP_NUM_THREADS=1
PYTEST=("$PY" -m pytest -q -p no:cacheprovider -o addopts="")
: > "$OUT/summary.txt"
failed=0

step() {
    local name="$1"; shift
    local start=$SECONDS
    "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    local last
    last="$(grep -E '(passed|failed|error)' "$OUT/$name.log" | tail -1)"
    [ -n "$last" ] || last="$(tail -1 "$OUT/$name.log")"
    local verdict=passed
    if [ $rc -ne 0 ]; then verdict=FAILED; failed=1; fi
    printf '%-10s %-7s %5ss  %s\n' "$name" "$verdict" "$((SECONDS - start))" "$last" | tee -a "$OUT/summary.txt"
}

echo "torch $VERSION ($VENV), $(date -u +%Y-%m-%dT%H:%MZ)" | tee -a "$OUT/summary.txt"
step compat "${PYTEST[@]}" tests/test_torch_compat.py
step ops "${PYTEST[@]}" tests/test_backend.py
step tools "${PYTEST[@]}" tests/test_backend_tools.py
step subgroups "${PYTEST[@]}" tests/test_safe_launch.py -k "gloo_group or one_rank"
step suite "${PYTEST[@]}" tests/test_conformance_subset.py
GATED="barrier_timeout or monitored_barrier or batch_isend_irecv_gloo"
step gated env BACKEND=gloo WORLD_SIZE=2 TEMP_DIR="$(mktemp -d)" \
    CCDDP_GROUP_SECRET="$("$PY" -c 'import os; print(os.urandom(32).hex())')" \
    "${PYTEST[@]}" --timeout 600 scripts/torch_conformance_gated.py -k "$GATED"
step selftest "$PY" -m ccddp.cli selftest --world-size 2
exit $failed
