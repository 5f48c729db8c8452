#!/usr/bin/env bash
# Installs ccddp, its measuring tools (the bench extra: the paper's workloads, the model's fits,
# tables and figures) and its test tools into the current Python environment.
# torch first, pinned, so that pip takes the CPU build instead of resolving a CUDA one.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
python -m pip install --quiet --disable-pip-version-check -e ".[bench,test]"
