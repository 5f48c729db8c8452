#!/usr/bin/env bash
# The two quiet-machine `ccddp characterize --quick` runs of BENCHMARKS.md, one after the
# other, each with its wall time and load average (timing.json) and its progress lines.
cd "$(dirname "$0")/../.."
for i in 1 2; do
  out=benchmarks/characterize/quick-r$i
  rm -rf $out
  start=$(date -u +%FT%TZ); l0=$(cut -d' ' -f1-3 /proc/loadavg); t0=$(date +%s)
  ccddp characterize --quick --out $out > /tmp/quick-r$i.log 2>&1
  rc=$?
  t1=$(date +%s); l1=$(cut -d' ' -f1-3 /proc/loadavg)
  mv /tmp/quick-r$i.log $out/progress.log
  printf '{"start": "%s", "end": "%s", "wall_s": %d, "rc": %d, "loadavg_start": "%s", "loadavg_end": "%s"}\n' \
    "$start" "$(date -u +%FT%TZ)" $((t1-t0)) $rc "$l0" "$l1" > $out/timing.json
done
python scripts/characterize_table.py benchmarks/characterize/quick-r1 benchmarks/characterize/quick-r2
