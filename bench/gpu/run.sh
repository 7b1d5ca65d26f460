#!/usr/bin/env bash
# mutwo's GPU benchmark, one command on a GPU node:
#   bench/gpu/run.sh OUT_DIR [run_benchmark.py flags]
# MODELS_DIR (default OUT_DIR/models) receives the scripted models.
# Builds into build-gpu/ against the CUDA LibTorch of the installed PyTorch
# (see docs/gpu.md), scripts the models with that python3, runs the
# benchmark and writes JSON under OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: bench/gpu/run.sh OUT_DIR [flags]}
shift
export CMAKE_PREFIX_PATH=${CMAKE_PREFIX_PATH:-$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')}
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUTWO_BUILD_TESTS=${MUTWO_BUILD_TESTS:-OFF} >&2
cmake --build build-gpu --target mutwo mutwo-worker >&2
MODELS_DIR=${MODELS_DIR:-$OUT/models}  # large files: keep them elsewhere if OUT is shipped
mkdir -p "$MODELS_DIR"
python3 bench/gpu/make_models.py "$MODELS_DIR"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/card.txt" || true
python3 bench/gpu/run_benchmark.py --bin build-gpu/bin --models_dir "$MODELS_DIR" --out "$OUT" "$@"
