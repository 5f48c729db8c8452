#!/usr/bin/env bash
# Run a command with the loopback device limited to RATE by a Linux token-bucket filter,
# so local ranks' transfers spend their time waiting on a link instead of copying on the
# ranks' cores -- the situation of a NIC or NVLink whose DMA leaves the cores free, where
# the pipelined schedule has transfer time to hide crypto behind. On raw loopback the
# kernel's socket copies use the same cores as AES-GCM (see BENCHMARKS.md).
#
# Needs root and `tc` (iproute2). The filter is removed on exit, also on error or Ctrl-C;
# while it is on, all loopback traffic of the machine is limited. Emulated, not a
# measured network.
#
# Usage: bash scripts/with_link_rate.sh RATE COMMAND [ARGS...]
#   bash scripts/with_link_rate.sh 8gbit ccddp bench collectives --world-size 2 --sizes 64M
set -euo pipefail
rate=${1:?usage: with_link_rate.sh RATE COMMAND [ARGS...]}
shift
[ $# -gt 0 ] || { echo "with_link_rate: no command given" >&2; exit 2; }
command -v tc >/dev/null || { echo "with_link_rate: tc (iproute2) not found" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "with_link_rate: needs root to change the loopback qdisc" >&2; exit 2; }
if tc qdisc show dev lo | grep -q tbf; then
  echo "with_link_rate: lo already has a tbf qdisc; remove it first (tc qdisc del dev lo root)" >&2; exit 2
fi
trap 'tc qdisc del dev lo root 2>/dev/null || true' EXIT
tc qdisc add dev lo root tbf rate "$rate" burst 1mb latency 100ms
echo "with_link_rate: $(tc qdisc show dev lo)" >&2
"$@"
