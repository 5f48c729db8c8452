#!/usr/bin/env bash
# The hierarchical all-reduce before and after trust domains were proven (issue 37): 4 ranks
# as 2 domains of 2, 64 MiB fp32, gloo and secure-domains taking turns call by call in each
# launch; launches alternate old (73afd36, plaintext inside a domain on gloo over loopback,
# checked out at /tmp/orig) and new (proven AF_UNIX links, at /tmp/new), the order flipping
# every round. Raw launches go to RAW (default /tmp/trust-proof-runs); only the summary is
# kept here.   ROUNDS=6 bash run.sh && python summarize.py
set -u
OUT=${RAW:-/tmp/trust-proof-runs}
ROUNDS=${ROUNDS:-6}
. "$(dirname "$0")/../ab_launch.sh"
LOG=$(cd "$(dirname "$0")" && pwd)/log.txt     # the load log stays with the summary
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="orig new"; else order="new orig"; fi
  for t in $order; do
    run dom-r$r $t python -m ccddp.cli bench collectives --world-size 4 --sizes 64M --impl gloo,secure-domains \
        --trust-domains '[[0,1],[2,3]]' --iters 12 --warmup 3 --json "$OUT/dom-r$r-$t.json"
  done
done
echo "$(date -u +%FT%TZ) ALL DONE" >> "$LOG"
