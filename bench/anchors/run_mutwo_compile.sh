#!/usr/bin/env bash
# mutwo under torch.compile and on the user's path, on one card, in one
# command: mutwo's schedules measured the way a user runs them, beside
# torch.compile's own activation_memory_budget.
#   bench/anchors/run_mutwo_compile.sh OUT_DIR [MODELS]   (default resnet152,transformer)
# Stages (each logs into OUT_DIR; OUT_DIR/progress.log says where it is,
# OUT_DIR/DONE marks the end; start it detached with setsid when it may take
# longer than one device command):
#  1. the package tests on this torch (client/python/tests/
#     test_compile_policy.py runs the selective-checkpointing policy eager
#     and under torch.compile on PyTorch >= 2.4; test_verify.py) -> tests.log
#  2. mutwo and mutwo-worker built into $BUILD (default /tmp/bg) unless
#     there, the models scripted, each profiled and planned at $BUDGETS
#     budgets from the floor to the baseline (bench/gpu/run_benchmark.py;
#     schedules executed by the worker only with EXECUTE=1) -> mutwo/
#  3. `python3 -m mutwo verify` (eager mutwo.apply beside the unmodified
#     step, torch.cuda.max_memory_allocated) on the lowest and a middle
#     schedule of each model -> verify/<model>_<budget>.json + .rc
#  4. anchors.py: eager, torch.compile at activation_memory_budget
#     1.0,0.5,0.2,0.05, and mutwo_compile (torch.compile of
#     mutwo._compile.apply_compiled(model, schedule)) at $POINTS schedules
#     -> anchors.jsonl
#  5. report.py -> report.md (the "mutwo under torch.compile vs compile's
#     activation_memory_budget" line per model), summary.json, plots.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: bench/anchors/run_mutwo_compile.sh OUT_DIR [MODELS]}
MODELS=${2:-resnet152,transformer}
BUILD=${BUILD:-/tmp/bg}
BUDGETS=${BUDGETS:-6}
POINTS=${POINTS:-4}
EXECUTE=${EXECUTE:-0}
# Flags for `mutwo plan`, e.g. PLAN_FLAGS=--swap=false: recomputation only,
# what the selective-checkpointing policy runs under torch.compile.
PLAN_FLAGS=${PLAN_FLAGS:-}
# LOSS_KIND=chunked_cross_entropy: mutwo's schedules planned with that loss
# (docs/loss.md); verify and the mutwo_compile points then compute it too.
LOSS_KIND=${LOSS_KIND:-cross_entropy}
# MUTWO_DIR=DIR: schedules already planned there (run_benchmark.py --out),
# for stage 4; stage 2 is skipped.
MUTWO_DIR=${MUTWO_DIR:-}
# torch.compile's own points, and whether stages 1 and 3 run (TESTS=0 and
# VERIFY=0 skip them, for a run split over cards that only compares).
COMPILE_BUDGETS=${COMPILE_BUDGETS:-1.0,0.5,0.2,0.05}
TESTS=${TESTS:-1}
VERIFY=${VERIFY:-1}
# Children warming up (compiling) at once in stage 4 (anchors.py
# --warm_in_parallel): each point is still timed alone.
WARM_IN_PARALLEL=${WARM_IN_PARALLEL:-1}
# Every point timed ROUNDS times in turns (anchors.py --rounds), ITERATIONS
# steps each: a drift of the machine then falls on all points alike.
ROUNDS=${ROUNDS:-1}
ITERATIONS=${ITERATIONS:-10}
mkdir -p "$OUT/mutwo" "$OUT/verify"
log() { echo "$(date -u +%H:%M:%S) $*" >> "$OUT/progress.log"; }
nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv > "$OUT/card.txt" 2>&1
python3 -c 'import torch; print("torch", torch.__version__)' >> "$OUT/card.txt" 2>&1
export PYTHONPATH=$PWD/client/python:$PWD/client/python/tests${PYTHONPATH:+:$PYTHONPATH}
if [ "$TESTS" = 1 ]; then
  python3 -m pytest -q -p no:cacheprovider client/python/tests/test_compile_policy.py \
    client/python/tests/test_verify.py bench/anchors/test_anchors.py > "$OUT/tests.log" 2>&1
  log "tests rc $?"
fi
if [ -z "$MUTWO_DIR" ] && [ ! -x "$BUILD/bin/mutwo-worker" ]; then
  export CMAKE_PREFIX_PATH=${CMAKE_PREFIX_PATH:-$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')}
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUTWO_BUILD_TESTS=OFF > "$OUT/build.log" 2>&1 &&
    cmake --build "$BUILD" --target mutwo mutwo-worker >> "$OUT/build.log" 2>&1 || { log "build failed"; exit 1; }
  log "built"
fi
MD=${MODELS_DIR:-$OUT/models}
python3 bench/gpu/make_models.py "$MD" ${MODELS//,/ } 2> "$OUT/models.log"
for m in ${MODELS//,/ }; do
  batch=$(python3 -c "import sys; sys.path.insert(0, 'bench/gpu'); from make_models import SPECS; print(SPECS['$m']['batch'])")
  exec_flag=()
  [ "$EXECUTE" = 1 ] || exec_flag=(--execute_batches "$m=0")
  SCHED=${MUTWO_DIR:-$OUT/mutwo}
  if [ -z "$MUTWO_DIR" ]; then
    python3 bench/gpu/run_benchmark.py --bin "$BUILD/bin" --models_dir "$MD" \
      --out "$OUT/mutwo" --models "$m" --batches "$m=$batch" --budgets "$BUDGETS" \
      --iterations 5 "${exec_flag[@]}" --plan_flags="$PLAN_FLAGS" \
      --loss_kind "$LOSS_KIND" 2>> "$OUT/mutwo.err"
    log "$m planned rc $?"
  fi
  # verify: the lowest feasible budget and the middle one.
  for s in $([ "$VERIFY" = 1 ] && python3 - "$SCHED" "$m" "$batch" <<'PY'
import sys
sys.path.insert(0, "bench/anchors")
from anchors import mutwo_schedules
found = mutwo_schedules(sys.argv[1], sys.argv[2], int(sys.argv[3]), 0)
for k in sorted({0, len(found) // 2}):
    if k < len(found):
        print(found[k][1])
PY
  ); do
    name=$(basename "$s" .schedule.json)
    python3 -m mutwo verify "bench/gpu/verify_models.py:$m" --schedule "$s" \
      --device cuda:0 --optimizer adam --steps 5 --output json \
      > "$OUT/verify/$name.json" 2> "$OUT/verify/$name.err"
    echo $? > "$OUT/verify/$name.rc"
    log "$m verify $name rc $(cat "$OUT/verify/$name.rc")"
  done
  python3 bench/anchors/anchors.py --models "$m" --systems eager,mutwo_compile \
    --compile_budgets "$COMPILE_BUDGETS" --mutwo_schedules "$SCHED" \
    --mutwo_compile_points "$POINTS" --out "$OUT/anchors.jsonl" --iterations "$ITERATIONS" \
    --warm_in_parallel "$WARM_IN_PARALLEL" --rounds "$ROUNDS" --timeout 600 > /dev/null 2>> "$OUT/anchors.err"
  log "$m anchors rc $?"
  python3 bench/anchors/report.py --anchors "$OUT/anchors.jsonl" --mutwo "$SCHED" \
    --out "$OUT" > "$OUT/report.log" 2>&1
  log "$m report rc $?"
done
touch "$OUT/DONE"
