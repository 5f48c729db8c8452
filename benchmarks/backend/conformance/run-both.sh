#!/usr/bin/env bash
# scripts/torch_conformance.sh, both backends at once (same environment, same arguments).
cd "$(dirname "$0")/../../.."
OUT=runs/conformance
export WORLD_SIZE=2 PYTHONPATH="$PWD/src"
export CCDDP_GROUP_SECRET="$(python -c 'import os; print(os.urandom(32).hex())')"
export CCDDP_SETTINGS='{"timeout_s": 120}'
for backend in gloo ccddp; do
  (
    TEMP_DIR="$(mktemp -d)"; export BACKEND="$backend" TEMP_DIR
    python -m pytest scripts/torch_conformance.py -v -p no:cacheprovider -o addopts="" --timeout 600 \
      --junitxml "$OUT/$backend.xml" > "$OUT/$backend.log" 2>&1
    echo "$backend rc=$? $(date -u +%FT%TZ)" >> $OUT/done.txt
    rm -rf "$TEMP_DIR"
  ) &
done
wait
python scripts/conformance_report.py "$OUT/gloo.xml" "$OUT/ccddp.xml" conformance/ccddp_exceptions.toml --json "$OUT/report.json" > $OUT/report.txt 2>&1
echo ALL >> $OUT/done.txt
