#!/usr/bin/env bash
# The third call of the first GPU session (2026-11-27): the GPU evidence provider of
# issue 41 on the lent H100 (pynvml from the carried nvidia_ml_py wheel), then issue 42's
# small-op recheck (benchmarks/small-ops/gpu_recheck.sh). Run from the repository root
# with carry [".whl"]; writes into $OUT (or ./gpu-probe2-out).
set -u
OUT=${OUT:-gpu-probe2-out}; mkdir -p "$OUT"
exec > >(tee "$OUT/probe2.log") 2>&1
site=$(mktemp -d)
python3 -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --target "$site" .whl/*.whl
export PYTHONPATH="$PWD/src:$site" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
echo "== attest ($(date +%T))"
python3 -c "import pynvml, ccddp; print('pynvml from', pynvml.__file__)"
nvidia-smi conf-compute -f 2>&1 | head -2
timeout 30 python3 -c "from ccddp.crypto.attest.provider import GpuProvider as G; print('gpu state', G().state())" 2>&1
timeout 60 python3 -m ccddp.cli attest --gpu-out /tmp/gpu.ev; echo "ccddp attest: exit $?"
if [ -f /tmp/gpu.ev ]; then
  printf 'format = "ccddp-attestation-policy/1"\n[gpu]\ndriver_versions = ["%s"]\nvbios_versions = ["%s"]\n' \
    "$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)" \
    "$(nvidia-smi --query-gpu=vbios_version --format=csv,noheader | head -1)" > /tmp/gpu.toml
  timeout 60 python3 -m ccddp.cli attest verify /tmp/gpu.ev --policy /tmp/gpu.toml; echo "verify: exit $?"
fi
echo "== small-ops recheck ($(date +%T))"
OUT="$OUT/small-ops" CCDDP_GPU_WHEELS=.whl timeout 210 bash benchmarks/small-ops/gpu_recheck.sh
echo "== done ($(date +%T))"
