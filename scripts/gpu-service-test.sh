#!/usr/bin/env bash
# The GPU service test on a GPU machine, after a GPU build:
# mutwo-server + one `mutwo-worker serve` per visible GPU with the deployment
# files' command line, two concurrent jobs (CNN + GPT-style transformer),
# every /metrics endpoint scraped. Results in OUT_DIR:
#   gpu_service.json     the figures for docs/gpu.md (also printed by ctest)
#   server.log, worker*.log, ctest.log, nvidia-smi.txt
#   static_tls.txt       civetweb-sized thread in a LibTorch process (why the
#                        metrics endpoint has its own HTTP server) from
#                        worker_test
#
#   scripts/gpu-service-test.sh OUT_DIR [BUILD_DIR]      (BUILD_DIR: build-gpu)
# The build must be configured with -DMUTWO_TORCH_PYTHON=$(which python3)
# (docs/gpu.md); the exit status is ctest's.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu-service-test.sh OUT_DIR [BUILD_DIR]}
build=${2:-${BUILD_DIR:-build-gpu}}
mkdir -p "$out"
out=$(cd "$out" && pwd)
nvidia-smi -L > "$out/nvidia-smi.txt" 2>&1
nvidia-smi >> "$out/nvidia-smi.txt" 2>&1
if [ -x "$build/bin/worker_test" ]; then
  "$build/bin/worker_test" --gtest_filter='MetricsInWorkerProcessTest.*' \
    > "$out/static_tls.txt" 2>&1
fi
export MUTWO_GPU_RESULTS_DIR="$out"
(cd "$build" && ctest -R '^gpu_service$' -L gpu --output-on-failure) 2>&1 |
  tee "$out/ctest.log"
rc=${PIPESTATUS[0]}
if ! grep -q 'gpu_service' "$out/ctest.log" || grep -q 'No tests were found' "$out/ctest.log"; then
  echo "gpu-service-test: ctest found no gpu_service test (is $build a CUDA build, MUTWO_WITH_CUDA=ON?)" >&2
  rc=1
fi
exit "$rc"
