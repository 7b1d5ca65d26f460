#!/usr/bin/env bash
# The zoo suite's GPU tier, one command on a GPU node:
#   bench/zoo/run_gpu.sh OUT_DIR [run_zoo.py flags, e.g. --models resnet50,gpt]
# Builds mutwo and mutwo-worker into build-gpu/ against the CUDA LibTorch of
# the installed PyTorch (docs/gpu.md), scripts the GPU-tier models with that
# python3 into $MODELS_DIR (default OUT_DIR/models; several GB), runs the
# suite on cuda:0 and writes OUT_DIR/zoo_results.json (after every model, so
# a run cut short keeps what it measured). Exit status: run_zoo's.
# ZOO_SCRIPT_JOBS (default 8) models are scripted at once; run_zoo's --jobs N
# runs N models at once on the card (peaks stay per process; step times are
# then taken on a shared card; a model out of memory beside others runs
# again alone).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: bench/zoo/run_gpu.sh OUT_DIR [run_zoo.py flags]}
shift
export CMAKE_PREFIX_PATH=${CMAKE_PREFIX_PATH:-$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')}
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUTWO_BUILD_TESTS=OFF >&2
cmake --build build-gpu --target mutwo mutwo-worker >&2
MODELS_DIR=${MODELS_DIR:-$OUT/models}
mkdir -p "$OUT" "$MODELS_DIR"
python3 bench/zoo/models.py --tier gpu --out "$MODELS_DIR" --jobs "${ZOO_SCRIPT_JOBS:-8}" ${ZOO_MODELS:+--models "$ZOO_MODELS"}
python3 bench/zoo/run_zoo.py --manifest "$MODELS_DIR/manifest.json" \
  --bin build-gpu/bin --device cuda:0 --out "$OUT" \
  --reproduce "${ZOO_MODELS:+ZOO_MODELS=$ZOO_MODELS }bench/zoo/run_gpu.sh $OUT $*" "$@"
