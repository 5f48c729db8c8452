#!/usr/bin/env bash
# PyTorch's backend conformance suite on gloo and on ccddp at world size 2; writes
# OUT/<backend>.xml (JUnit) and OUT/<backend>.log, then compares them
# (scripts/conformance_report.py) against conformance/ccddp_exceptions.toml.
#   bash scripts/torch_conformance.sh [OUT] [pytest -k EXPRESSION]
# The full suite takes hours on two shared cores: run it in the background, e.g.
#   nohup bash scripts/torch_conformance.sh runs/conformance > runs/conformance.out 2>&1 &
# Ranks are spawned as PyTorch spawns them; CONFORMANCE_START=forkserver forks them from a
# process that imported the suite once (a fifth of the CPU; what tests/ uses for its slice).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-runs/conformance}"
FILTER="${2:-}"
mkdir -p "$OUT"
python -c "import expecttest" 2>/dev/null || { echo "needs expecttest: pip install expecttest" >&2; exit 2; }
export WORLD_SIZE=2 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export CCDDP_GROUP_SECRET="${CCDDP_GROUP_SECRET:-$(python -c 'import os; print(os.urandom(32).hex())')}"
# Peer waits of a ccddp group end after 120 s (the suite's per-test limit is 300 s).
export CCDDP_SETTINGS="${CCDDP_SETTINGS:-{\"timeout_s\": 120}}"
for backend in gloo ccddp; do
    TEMP_DIR="$(mktemp -d)"
    export BACKEND="$backend" TEMP_DIR
    args=(-v -p no:cacheprovider -o addopts="" --timeout 600 --junitxml "$OUT/$backend.xml")
    if [ -n "$FILTER" ]; then args+=(-k "$FILTER"); fi
    python -m pytest scripts/torch_conformance.py "${args[@]}" > "$OUT/$backend.log" 2>&1 || true
    tail -1 "$OUT/$backend.log"
    rm -rf "$TEMP_DIR"
done
python scripts/conformance_report.py "$OUT/gloo.xml" "$OUT/ccddp.xml" conformance/ccddp_exceptions.toml \
    --json "$OUT/report.json"
