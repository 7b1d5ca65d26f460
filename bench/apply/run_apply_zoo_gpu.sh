#!/bin/bash
# The GPU apply zoo (bench/apply/apply_zoo_gpu.py) on every card of one
# machine: one shard of the models per card, started detached so that a
# later call can collect them.
#
#   run_apply_zoo_gpu.sh start    # build mutwo + mutwo-worker, start shards,
#                                 # then as `wait`
#   run_apply_zoo_gpu.sh wait     # wait for the shards (at most WAIT_S s),
#                                 # then as `collect`
#   run_apply_zoo_gpu.sh collect  # merge the shards, tar into $OUT
#
# Environment: WORK (default /tmp/az), BUILD (default /tmp/bg), NGPU
# (default: every card nvidia-smi lists), SHARDS (default NGPU: shard k
# runs on card k mod NGPU; more shards than cards share a card, which
# leaves the memory, gradient and applied bars valid but not the time
# bar), WAIT_S (default 480), TRACE (a
# model whose lowest-budget schedule its shard traces with torch.profiler
# and cProfile after its points; default resnet50, "" for none), PROBE
# (models whose shard runs apply_zoo_gpu.py --probe after its points, with
# the model's higher-budget schedule; "" for none), EXTRA
# (more apply_zoo_gpu.py flags), TRACE_FLAGS (more --trace flags), MEMSNAP
# (models whose shard runs apply_memsnap.py after its points: where the
# peak of a step lies, eager, applied and applied without its swaps, with
# the model's lowest-budget schedule; default none). Run
# from the source root, after `source .gpu/device-env.sh` (docs/gpu.md).
set -u
cmd=${1:-wait}
W=${WORK:-/tmp/az}
B=${BUILD:-/tmp/bg}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PY=$SRC/bench/apply/apply_zoo_gpu.py
PYTHON=${PYTHON:-python3}
T=${TRACE-resnet50}
P=${PROBE-resnet18,mnasnet1_0,efficientnet_b0,vgg11_bn,squeezenet1_1}
mkdir -p "$W"

if [ "$cmd" = start ]; then
  t0=$(date +%s)
  { cmake -S "$SRC" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DMUTWO_BUILD_TESTS=OFF -DMUTWO_BUILD_BENCH=OFF \
      -DCMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:-}" &&
    cmake --build "$B" --target mutwo mutwo-worker; } >"$W/build.log" 2>&1 ||
    { tail -30 "$W/build.log"; exit 1; }
  echo "built in $(( $(date +%s) - t0 )) s"
  cards=${NGPU:-$(nvidia-smi -L | wc -l)}
  n=${SHARDS:-$cards}
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader >"$W/cards.txt"
  for k in $(seq 0 $((n - 1))); do
    # A session of its own: the device tool ends what a call leaves
    # running, except such processes.
    setsid nohup bash "$0" shard "$k" "$n" "$cards" >"$W/shard$k.log" 2>&1 </dev/null &
    echo $! >"$W/shard$k.pid"
  done
  echo "started $n shards"
  cmd=wait
fi

if [ "$cmd" = shard ]; then
  k=$2 n=$3 cards=${4:-$3}
  export CUDA_VISIBLE_DEVICES=$((k % cards)) PYTHONUNBUFFERED=1
  "$PYTHON" "$PY" --bin "$B/bin" --out "$W/shard$k" --shard "$k/$n" \
    --specialize transformer_encoder --no-fail ${EXTRA:-}
  s=$(ls "$W/shard$k/$T".*B.schedule.json 2>/dev/null | sort -t. -k2,2n |
    head -1)
  if [ -n "$T" ] && [ -n "$s" ]; then
    "$PYTHON" "$PY" --trace --model "$T" --schedule "$s" --out "$W/trace_$T" \
      ${TRACE_FLAGS:-} || true
  fi
  # Peak per phase and variant (probe) of the PROBE models this shard ran,
  # with their higher-budget schedule.
  for pm in $(echo "$P" | tr , ' '); do
    ps=$(ls "$W/shard$k/$pm".*B.schedule.json 2>/dev/null | sort -t. -k2,2n |
      tail -1)
    [ -n "$ps" ] || continue
    "$PYTHON" "$PY" --probe --model "$pm" --schedule "$ps" \
      --out "$W/probe" || true
  done
  # Where the step's peak lies (allocator history) for the MEMSNAP models.
  for mm in $(echo "${MEMSNAP:-}" | tr , ' '); do
    ms=$(ls "$W/shard$k/$mm".*B.schedule.json 2>/dev/null | sort -t. -k2,2n |
      head -1)
    [ -n "$ms" ] || continue
    "$PYTHON" "$SRC/bench/apply/apply_memsnap.py" --model "$mm" \
      --schedule "$ms" --out "$W/memsnap" \
      --variants eager,applied,applied_no_swaps >>"$W/memsnap.log" 2>&1 || true
  done
  echo done >"$W/shard$k.done"
  exit 0
fi

if [ "$cmd" = wait ]; then
  deadline=$(( $(date +%s) + ${WAIT_S:-480} ))
  while [ "$(date +%s)" -lt $deadline ]; do
    left=0
    for p in "$W"/shard*.pid; do
      k=${p%.pid}
      [ -f "$k.done" ] || left=$((left + 1))
    done
    [ $left -eq 0 ] && break
    sleep 5
  done
  cmd=collect
fi

if [ "$cmd" = collect ]; then
  for p in "$W"/shard*.pid; do
    k=${p%.pid}
    n=$(cat "$k/points.jsonl" 2>/dev/null | wc -l)
    echo "$(basename "$k"): $n points, $([ -f "$k.done" ] && echo done || echo running)"
  done
  "$PYTHON" "$PY" --merge "$W"/shard[0-9]*/ --out "$W/merged" --no-fail |
    cut -c1-3000
  if [ -n "${OUT:-}" ]; then
    tar czf "$OUT/apply_zoo_gpu.tgz" -C "$W" --exclude='*.pt' \
      --exclude='*.profile.json' .
    cp "$W/merged/summary.json" "$W/merged/table.md" "$OUT/" 2>/dev/null
    ls -la "$OUT"
  fi
fi
