#!/usr/bin/env bash
# The second call of the first GPU session (2026-11-27, after scripts/gpu_check.sh passed):
# `ccddp attest` on the lent machine (issue 41), where the device AES-GCM engine's time goes
# (scripts/gpu_profile_engine.py), the host side of a 4 KiB seal (cProfile), and small
# sealed collectives on CUDA tensors (issue 42). Run from the repository root with
# carry [".whl"]; writes into $OUT (or ./gpu-probe-out).
set -u
OUT=${OUT:-gpu-probe-out}; mkdir -p "$OUT"
exec > >(tee "$OUT/probe.log") 2>&1
site=$(mktemp -d)
python3 -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --target "$site" .whl/*.whl
export PYTHONPATH="$PWD/src:$site" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
step() { echo "== $1 ($(date +%T))"; }
step attest
{ timeout 30 python3 -m ccddp.cli attest; echo "ccddp attest: exit $?"
  ls -la /sys/kernel/config/tsm /dev/sev-guest /dev/tdx_guest /dev/tpm0 2>&1
  nvidia-smi conf-compute -f 2>&1; nvidia-smi conf-compute -grs 2>&1; nvidia-smi conf-compute -gdm 2>&1
  nvidia-smi -q 2>&1 | grep -i -A3 -E "confidential|cc mode|attestation"
  grep -m1 -o -w -E "sev_snp|tdx_guest|hypervisor" /proc/cpuinfo | sort -u; } > "$OUT/attest.txt" 2>&1
cat "$OUT/attest.txt"
step profile
timeout 150 python3 scripts/gpu_profile_engine.py --sizes 4K,64K,1M,16M,64M --reps 20 --json "$OUT/profile.json"
step host-4K
timeout 45 python3 - > "$OUT/host-4K.txt" 2>&1 <<'PY'
import cProfile, os, pstats, torch
from ccddp.crypto.device import DeviceAESGCM
a = DeviceAESGCM(os.urandom(32)); d = torch.zeros(4096, dtype=torch.uint8, device="cuda")
f = torch.empty(4112, dtype=torch.uint8, device="cuda"); aad = b"\0" * 64
for i in range(5): a.encrypt_into(i.to_bytes(12, "big"), d, aad, f)
torch.cuda.synchronize()
pr = cProfile.Profile(); pr.enable()
for i in range(5, 505): a.encrypt_into(i.to_bytes(12, "big"), d, aad, f)
torch.cuda.synchronize(); pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
PY
head -40 "$OUT/host-4K.txt"
for placement in device staged; do
  step "collectives-small-$placement"
  timeout 90 python3 -m ccddp.cli bench collectives --device cuda --placement $placement --world-size 2 \
    --impl gloo,secure --sizes 4K,64K,1M --iters 20 --timeout 30 --json "$OUT/coll-small-$placement.json"
done
step done
