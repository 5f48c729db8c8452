#!/usr/bin/env bash
# The image-version rehearsal of the GPU check: what the lent GPU machine will run, in an
# environment built like its image (Python 3.12, torch 2.11.0, Triton 3.6.0, numpy,
# pytest, pytest-timeout, hypothesis, scipy, transformers, torch-geometric (the workloads
# the SecureDDP tests train); cryptography NOT installed, reachable only
# through the carried wheel folder on PYTHONPATH), without a GPU:
#   1. dry-run    bash scripts/gpu_check.sh --dry-run with that Python: every step that
#                 needs no GPU passes, the rest say there is no GPU
#   2. twins      the CPU twins of the CUDA cases (the same files, -k "not cuda") and the
#                 device engine's tests in Triton 3.6's interpreter (TRITON_INTERPRET=1),
#                 with cryptography only from the wheel folder, plus tests/test_child_env.py
# A development machine has cryptography in site-packages and Triton 3.9: there, a helper
# that drops the wheel folder, or a kernel that Triton 3.6 cannot run, goes unseen.
#
# Opt-in, not in the default test run: the first build downloads torch 2.11's CUDA wheel
# and its NVIDIA libraries (several GB; the only torch 2.11 build on the index, it imports
# without a GPU). The venv is kept and reused (a second run builds nothing).
#
#   bash scripts/gpu_check_image.sh                      # builds the venv if needed, runs both
#   CCDDP_IMAGE_VENV=/work/venv-img bash scripts/gpu_check_image.sh
#
# Environment: CCDDP_IMAGE_VENV (default ~/.cache/ccddp/gpu-image-venv), CCDDP_IMAGE_PYTHON
# (the interpreter to build it with; default python3.12), OUT (default runs/gpu-image),
# CCDDP_GPU_WHEELS (default .whl; made by scripts/gpu_wheels.sh when missing).
# Writes OUT/image-rehearsal.json (versions, each part's exit code and seconds) and the dry
# run's files under OUT/dry-run. Exit 0 when both parts pass, 1 when one fails, 2 when the
# environment cannot be built as the image is (e.g. cryptography is importable without the
# wheel folder).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${CCDDP_IMAGE_VENV:-$HOME/.cache/ccddp/gpu-image-venv}
BUILD_PY=${CCDDP_IMAGE_PYTHON:-python3.12}
OUT=${OUT:-runs/gpu-image}
WHEELS=${CCDDP_GPU_WHEELS:-.whl}
# The image's versions (DESIGN.md section 12) and the packages of its list that the steps use.
IMAGE_PACKAGES=(torch==2.11.0 triton==3.6.0 numpy pytest pytest-timeout hypothesis scipy transformers torch-geometric)
TORCH_WANT=2.11.0
TRITON_WANT=3.6.0
# Files with CUDA cases: their other cases are the CPU twins (tests/test_gpu_check.py's list).
TWIN_FILES=(tests/test_device_aead.py tests/test_device_channel.py tests/test_pads.py tests/test_backend_device.py
            tests/test_bounce.py tests/test_ordered_wire.py tests/test_child_env.py)

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ccddp-gpu-image.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
START=$SECONDS
say() { printf 'gpu_check_image: %s\n' "$*"; }

# -- the venv: built once, checked every time ----------------------------------------------
t0=$SECONDS
if [[ ! -x $VENV/bin/python ]]; then
    command -v "$BUILD_PY" >/dev/null || { say "cannot build: no $BUILD_PY (set CCDDP_IMAGE_PYTHON)"; exit 2; }
    say "building $VENV (torch $TORCH_WANT with its CUDA libraries: several GB the first time)"
    "$BUILD_PY" -m venv "$VENV"
fi
versions=$("$VENV/bin/python" -c 'import torch, triton; print(torch.__version__.split("+")[0], triton.__version__)' \
    2>/dev/null || true)
if [[ $versions != "$TORCH_WANT $TRITON_WANT" ]]; then
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${IMAGE_PACKAGES[@]}"
    versions=$("$VENV/bin/python" -c 'import torch, triton; print(torch.__version__.split("+")[0], triton.__version__)')
fi
build_s=$((SECONDS - t0))
if [[ $versions != "$TORCH_WANT $TRITON_WANT" ]]; then
    say "cannot run: the venv has torch/Triton $versions, not $TORCH_WANT $TRITON_WANT"
    exit 2
fi
# The image has no cryptography: here neither, or the wheel folder is not what is tested.
if env -u PYTHONPATH "$VENV/bin/python" -c 'import cryptography' 2>/dev/null; then
    say "cannot run: cryptography is installed in $VENV; the image has none (pip uninstall it there)"
    exit 2
fi

# -- the wheel folder, as the check carries it ---------------------------------------------
if ! compgen -G "$WHEELS/*.whl" >/dev/null; then
    say "no wheels in $WHEELS: making them (bash scripts/gpu_wheels.sh)"
    PYTHON="$VENV/bin/python" bash scripts/gpu_wheels.sh >/dev/null
fi
SITE=$WORK/site
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps --only-binary=:all: \
    --target "$SITE" "$WHEELS"/*.whl
VECTORS=$(cd "$WHEELS/gcm-vectors" && pwd)

# -- 1. the GPU check's dry run with the image's Python ------------------------------------
t0=$SECONDS
set +e
env -u PYTHONPATH PYTHON="$VENV/bin/python" OUT="$OUT/dry-run" CCDDP_GPU_WHEELS="$WHEELS" \
    bash scripts/gpu_check.sh --dry-run >"$OUT/dry-run.log" 2>&1
dry_rc=$?
set -e
dry_s=$((SECONDS - t0))
say "dry-run: exit $dry_rc in ${dry_s}s ($(tail -n 1 "$OUT/dry-run.log"))"

# -- 2. the CPU twins and the engine in Triton 3.6's interpreter ---------------------------
t0=$SECONDS
set +e
env PYTHONPATH="$SITE:$PWD/src" TRITON_INTERPRET=1 CCDDP_GCM_VECTORS="$VECTORS" \
    "$VENV/bin/python" -m pytest -q -p no:cacheprovider -k "not cuda" --timeout 600 --durations=10 \
    --junitxml "$OUT/twins.xml" "${TWIN_FILES[@]}" >"$OUT/twins.log" 2>&1
twins_rc=$?
set -e
twins_s=$((SECONDS - t0))
say "twins: exit $twins_rc in ${twins_s}s ($(grep -E '(passed|failed|error)' "$OUT/twins.log" | tail -n 1))"

"$VENV/bin/python" - "$OUT/image-rehearsal.json" "$versions" "$build_s" "$dry_rc" "$dry_s" "$twins_rc" "$twins_s" \
    "$((SECONDS - START))" "${TWIN_FILES[@]}" <<'EOF'
import json, platform, sys
out, versions, build_s, dry_rc, dry_s, twins_rc, twins_s, total_s, *files = sys.argv[1:]
torch_v, triton_v = versions.split()
json.dump({"schema": "ccddp.gpu-image-rehearsal/1", "python": platform.python_version(), "torch": torch_v,
           "triton": triton_v, "cryptography": "wheel folder on PYTHONPATH only",
           "venv_check_s": int(build_s), "dry_run": {"rc": int(dry_rc), "seconds": int(dry_s)},
           "twins": {"rc": int(twins_rc), "seconds": int(twins_s), "files": files, "select": "not cuda",
                     "triton_interpret": True},
           "total_s": int(total_s), "ok": dry_rc == "0" and twins_rc == "0"}, open(out, "w"), indent=2)
EOF
if ((dry_rc != 0 || twins_rc != 0)); then
    say "not ok (logs in $OUT)"
    exit 1
fi
say "ok in $((SECONDS - START))s"
