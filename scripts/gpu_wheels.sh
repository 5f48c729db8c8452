#!/usr/bin/env bash
# Prepare .whl/ for the GPU check (scripts/gpu_check.sh): the Python packages that the lent
# GPU machine's image lacks, as wheels for its Python (CPython 3.12, manylinux x86_64),
# downloaded here because that machine reaches no package index. Run from anywhere:
#
#   bash scripts/gpu_wheels.sh            # then carry .whl with the check
#   GPU_PYTHON=3.13 bash scripts/gpu_wheels.sh   # for an image with another Python
#
# What the image lacks, and why the check needs it (the image has torch, Triton, numpy,
# scipy, pytest, pytest-timeout, hypothesis and sortedcontainers, rich, psutil, matplotlib,
# transformers, torch-geometric, accelerate; not these):
#   cryptography 50.0.2  ccddp's host AES-GCM: the channel, the device engine's key schedule
#                        (tag masks), the tests' reference and the bench's OpenSSL rows;
#                        >= 50 for encrypt_into/decrypt_into. One abi3 wheel, any CPython >= 3.11.
#   cffi 2.0.0           cryptography's Requires-Dist: cffi>=2.0.0 (on CPython); a cp312 wheel.
#   pycparser 3.0        cffi's Requires-Dist: pycparser.
#   NIST GCM vectors     the tests read two files of cryptography_vectors (gcmEncryptExtIV256.rsp,
#                        gcmDecrypt256.rsp, 6 MB); the package is a 56 MB wheel, too big for the
#                        64 MiB a call may carry, so only those two go to .whl/gcm-vectors/, which
#                        tests/_gcm_vectors.py reads when CCDDP_GCM_VECTORS names it (the check sets it).
# The end of this script checks every wheel's Requires-Dist against the folder, so a new
# version that needs another package fails here, not there.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
GPU_PYTHON=${GPU_PYTHON:-3.12}
DEST=.whl
WHEELS=(cryptography==50.0.2 cffi==2.0.0 pycparser==3.0)
VECTORS=cryptography_vectors==50.0.2          # same release as cryptography
VECTOR_FILES=(gcmEncryptExtIV256.rsp gcmDecrypt256.rsp)
# pip matches manylinux tags exactly. None above 2_28: those need glibc >= 2.28, which any
# current image has (cryptography also publishes a 2_34 wheel, needing a newer glibc).
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64)

grep -qx '/.whl/' .gitignore 2>/dev/null ||
    echo "gpu_wheels: note: .whl is not in .gitignore; it must be ignored to be carried" >&2

# One version of each package in the folder: two stop the whole install there.
rm -rf "$DEST"
mkdir -p "$DEST"
download() {  # into $1
    "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version "$GPU_PYTHON" --implementation cp "${PLATFORMS[@]}" -d "$1" "${@:2}"
}
download "$DEST" "${WHEELS[@]}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
download "$tmp" "$VECTORS"
"$PY" - "$tmp"/cryptography_vectors-*.whl "$DEST/gcm-vectors" "${VECTOR_FILES[@]}" <<'EOF'
import os, sys, zipfile
wheel, dest, names = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(wheel) as z:
    for name in names:
        member = f"cryptography_vectors/ciphers/AES/GCM/{name}"
        path = os.path.join(dest, "ciphers", "AES", "GCM", name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with z.open(member) as src, open(path, "wb") as dst:
            dst.write(src.read())
EOF
echo "$GPU_PYTHON" >"$DEST/python-version"

# Every runtime requirement of every wheel (markers evaluated for CPython $GPU_PYTHON on
# Linux x86_64) must be met by a wheel in the folder or be on the image.
"$PY" - "$DEST" "$GPU_PYTHON" <<'EOF'
import glob, os, re, sys, zipfile
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
dest, pyver = sys.argv[1], sys.argv[2]
env = {"python_version": pyver, "python_full_version": pyver + ".0", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "os_name": "posix", "extra": ""}
on_image = {"typing-extensions"}          # the image has it (and the marker excludes 3.12 anyway)
have = {}
for w in glob.glob(os.path.join(dest, "*.whl")):
    name, version = os.path.basename(w).split("-")[:2]
    have[re.sub(r"[-_.]+", "-", name).lower()] = version
bad = []
for w in sorted(glob.glob(os.path.join(dest, "*.whl"))):
    with zipfile.ZipFile(w) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    for line in meta.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        key = re.sub(r"[-_.]+", "-", req.name).lower()
        where = f"{key} {have[key]} in the folder" if key in have else "on the image" if key in on_image else "MISSING"
        print(f"  {os.path.basename(w).split('-')[0]} needs {req}: {where}")
        if key in on_image:
            continue
        if key not in have or not req.specifier.contains(have[key], prereleases=True):
            bad.append(str(req))
if bad:
    sys.exit("gpu_wheels: the folder lacks " + ", ".join(bad) + ": add them to WHEELS in scripts/gpu_wheels.sh")
EOF

ls -l "$DEST"
echo "gpu_wheels: $(du -sh "$DEST" | cut -f1) in $DEST (with the tree, 64 MiB at most travel to the GPU machine)"
