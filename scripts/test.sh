#!/usr/bin/env bash
# The test command (README): bootstrap (install + build), check formatting,
# then run every test with ctest. GPU-only tests carry the label `gpu` and are
# excluded when no NVIDIA GPU is visible.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/check-format.sh
BUILD_DIR=${BUILD_DIR:-build}
label_args=()
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  label_args=(-LE gpu)
fi
cd "$BUILD_DIR"
ctest --output-on-failure -j"${CTEST_JOBS:-2}" "${label_args[@]}" "$@"
