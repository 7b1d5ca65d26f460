#!/usr/bin/env bash
# The C++ (ScheduledStep) and torch.compile measurements on a node with one
# card per anchor model (bench/gpu/make_models.py: resnet152, transformer,
# gpt, vit_b_16):
#   bench/apply/run_gpu_bars.sh start RUN_DIR   # builds, starts one shard per card, detached
#   bench/apply/run_gpu_bars.sh status RUN_DIR  # progress lines
#   bench/apply/run_gpu_bars.sh collect RUN_DIR TARBALL
# Per card, one model: first bench/apply/scheduled_step_zoo.py (the
# schedule through mutwo::ScheduledStep beside `mutwo-worker execute`, at
# floor + 0.1 and 0.5 of the way to the baseline; --time_bar 0.10), then
# bench/anchors/run_mutwo_compile.sh with PLAN_FLAGS=--swap=false (mutwo's
# recompute-only schedules under torch.compile beside compile's own
# activation_memory_budget points). MODELS (default the four) picks models,
# in card order. Environment as run_mutwo_compile.sh (BUDGETS, POINTS,
# COMPILE_BUDGETS).
set -uo pipefail
cd "$(dirname "$0")/../.."
cmd=${1:?usage: run_gpu_bars.sh start|status|collect RUN_DIR [TARBALL]}
RUN=${2:?RUN_DIR}
MODELS=${MODELS:-resnet152,transformer,gpt,vit_b_16}
BUILD=${BUILD:-/tmp/bg}
case "$cmd" in
start)
  mkdir -p "$RUN"
  export CMAKE_PREFIX_PATH=${CMAKE_PREFIX_PATH:-$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')}
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DMUTWO_BUILD_TESTS=OFF &&
    cmake --build "$BUILD" --target mutwo mutwo-worker scheduled_step_bench; } \
    > "$RUN/build.log" 2>&1 || { tail -20 "$RUN/build.log"; exit 1; }
  python3 bench/gpu/make_models.py "$RUN/models" ${MODELS//,/ } > "$RUN/models.log" 2>&1 ||
    { tail -20 "$RUN/models.log"; exit 1; }
  card=0
  for m in ${MODELS//,/ }; do
    out="$RUN/$m"
    mkdir -p "$out"
    CUDA_VISIBLE_DEVICES=$card setsid nohup bash -c "
      python3 bench/apply/scheduled_step_zoo.py --bin '$BUILD/bin' --out '$out/scheduled_step' \
        --gpu_models $m --models_dir '$RUN/models' --device cuda:0 \
        --fractions 0.1,0.5 --iterations 5 --time_bar 0.10 \
        > '$out/scheduled_step.jsonl' 2> '$out/scheduled_step.err'
      echo \"scheduled_step rc \$?\" >> '$out/progress.log'
      BUILD='$BUILD' MODELS_DIR='$RUN/models' TESTS=0 VERIFY=0 PLAN_FLAGS=--swap=false \
        bash bench/anchors/run_mutwo_compile.sh '$out/compile' $m
      echo \"compile rc \$?\" >> '$out/progress.log'
      touch '$out/DONE'" > "$out/shard.log" 2>&1 < /dev/null &
    card=$((card + 1))
  done
  sleep 2
  echo "started ${MODELS} on cards 0..$((card - 1)) in $RUN"
  ;;
status)
  for d in "$RUN"/*/; do
    [ -d "$d/scheduled_step" ] || [ -f "$d/progress.log" ] || continue
    echo "== $d $( [ -f "$d/DONE" ] && echo DONE)"
    cat "$d/progress.log" "$d/compile/progress.log" 2>/dev/null | tail -4
  done
  ;;
collect)
  TAR=${3:?TARBALL}
  tar czf "$TAR" -C "$(dirname "$RUN")" --exclude='models' --exclude='*.pt' \
    --exclude='*_profile.json' "$(basename "$RUN")"
  ls -la "$TAR"
  ;;
*) echo "unknown command $cmd" >&2; exit 2 ;;
esac
