#!/usr/bin/env bash
# The zoo suite's CPU tier end to end (ctest -L zoo):
#   bench/zoo/ctest_cpu.sh PYTHON BIN_DIR [RESULTS_DIR]
# Scripts the CPU-tier models into a temp dir (models.py), runs run_zoo.py
# against BIN_DIR and fails when a bar fails. RESULTS_DIR (default: the
# temp dir, removed; or $ZOO_RESULTS_DIR) receives zoo_results.json.
# $ZOO_FLAGS: extra run_zoo.py flags (e.g. --no-fail). $ZOO_MODELS_DIR: the
# models already scripted there (its manifest.json; ctest's zoo_cpu_models
# scripts them once for zoo_cpu and zoo_cpu_swap) instead of the temp dir.
# The CPU tier trains with SGD: at its sizes (batch 2, 32-128 px) Adam's two state tensors per
# parameter put the peak in the optimizer step for 25 of 30 models, whose
# floor is then the baseline and whose schedules exercise nothing.
set -euo pipefail
PYTHON=${1:?usage: ctest_cpu.sh PYTHON BIN_DIR [RESULTS_DIR]}
BIN=${2:?usage: ctest_cpu.sh PYTHON BIN_DIR [RESULTS_DIR]}
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/mutwo-zoo-cpu.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
OUT=${3:-${ZOO_RESULTS_DIR:-$TMP/results}}
MODELS=${ZOO_MODELS_DIR:-$TMP/models}
if [ -z "${ZOO_MODELS_DIR:-}" ] || [ ! -f "$MODELS/manifest.json" ]; then
  "$PYTHON" "$HERE/models.py" --tier cpu --out "$MODELS"
fi
"$PYTHON" "$HERE/run_zoo.py" --manifest "$MODELS/manifest.json" \
  --bin "$BIN" --device cpu --optimizer sgd --out "$OUT" ${ZOO_FLAGS:-} \
  --reproduce "bench/zoo/ctest_cpu.sh $PYTHON $BIN RESULTS_DIR (ctest -R zoo in the build dir)"
