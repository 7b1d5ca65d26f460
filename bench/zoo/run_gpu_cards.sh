#!/usr/bin/env bash
# The zoo's GPU tier on every card of one machine, one shard of the models
# per card, and then (ANCHORS) one bench/anchors model per card, each alone
# on its card once that card's zoo shard is done. Started detached so that
# later device calls collect it (one call runs at most 10 minutes):
#
#   bench/zoo/run_gpu_cards.sh run RUN_DIR OUT_DIR   # all three in one call
#   bench/zoo/run_gpu_cards.sh start RUN_DIR     # build, script, start shards
#   bench/zoo/run_gpu_cards.sh status RUN_DIR    # progress lines
#   bench/zoo/run_gpu_cards.sh collect RUN_DIR OUT_DIR
#       # merge the shards into OUT_DIR/zoo_results.json, the anchors into
#       # OUT_DIR/anchors_<model>.tgz, logs into OUT_DIR/logs.tgz
#
# A lent machine is not kept between calls reliably (one went back seconds
# after a call that ended with it "warm"): collect into $OUT in the call
# that waits, and give each call work that ends within it. The zoo alone
# (ANCHORS="") fits one 10-minute call on 4 cards: build 42 s, scripting
# 30 s, shards 5.5-6.5 min at JOBS=3 on H200s.
#
# Environment: SUITE (gpu: bench/zoo/models.py's GPU tier, the default;
# ext: bench/zoo/models_ext.py's timm and transformers models, TIMM=families
# for one timm model per timm family, TIMM=all for every timm model), BUILD
# (default /tmp/bg: mutwo and mutwo-worker are built there against the
# installed PyTorch's LibTorch), NGPU (default: every
# card), JOBS (models at once per card, default 3: peaks stay per process,
# step times are taken on a shared card), ZOO_MODELS (a subset), ANCHORS
# (bench/anchors models in card order, default
# resnet152,transformer,gpt,vit_b_16; "" for none), ZOO_FLAGS (more
# run_zoo.py flags). Run from the source root after
# `source .gpu/device-env.sh` (docs/gpu.md).
set -uo pipefail
cd "$(dirname "$0")/../.."
cmd=${1:?usage: run_gpu_cards.sh run|start|status|collect RUN_DIR [OUT_DIR]}
RUN=${2:?RUN_DIR}
BUILD=${BUILD:-/tmp/bg}
ANCHORS=${ANCHORS-resnet152,transformer,gpt,vit_b_16}
case "$cmd" in
start)
  mkdir -p "$RUN"
  t0=$(date +%s)
  export CMAKE_PREFIX_PATH=${CMAKE_PREFIX_PATH:-$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')}
  { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DMUTWO_BUILD_TESTS=OFF -DMUTWO_BUILD_BENCH=OFF &&
    cmake --build "$BUILD" --target mutwo mutwo-worker; } \
    > "$RUN/build.log" 2>&1 || { tail -20 "$RUN/build.log"; exit 1; }
  echo "built in $(( $(date +%s) - t0 )) s"
  n=${NGPU:-$(nvidia-smi -L | wc -l)}
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv \
    > "$RUN/cards.txt"
  if [ "${SUITE:-gpu}" = ext ]; then
    python3 bench/zoo/models_ext.py --out "$RUN/models" \
      --jobs "${ZOO_SCRIPT_JOBS:-16}" \
      ${ZOO_MODELS:+--models "$ZOO_MODELS"} ${TIMM:+--timm "$TIMM"}
  else
    python3 bench/zoo/models.py --tier gpu --out "$RUN/models" \
      --jobs "${ZOO_SCRIPT_JOBS:-24}" ${ZOO_MODELS:+--models "$ZOO_MODELS"}
  fi > "$RUN/models.log" 2>&1 || { tail -20 "$RUN/models.log"; exit 1; }
  tail -1 "$RUN/models.log"
  echo "scripted by $(( $(date +%s) - t0 )) s"
  # The command as run, with the environment that chose what ran.
  reproduce="SUITE=${SUITE:-gpu}${TIMM:+ TIMM=$TIMM} JOBS=${JOBS:-3}"
  reproduce+="${ZOO_MODELS:+ ZOO_MODELS=$ZOO_MODELS}"
  reproduce+="${ZOO_FLAGS:+ ZOO_FLAGS=\"$ZOO_FLAGS\"} ANCHORS=$ANCHORS"
  reproduce+=" bash bench/zoo/run_gpu_cards.sh run RUN OUT"
  anchors=(${ANCHORS//,/ })
  for k in $(seq 0 $((n - 1))); do
    a=${anchors[$k]:-}
    # A session of its own: the device tool ends what a call leaves
    # running, except such processes.
    CUDA_VISIBLE_DEVICES=$k setsid nohup bash -c "
      python3 bench/zoo/run_zoo.py --manifest '$RUN/models/manifest.json' \
        --bin '$BUILD/bin' --device cuda:0 --out '$RUN/shard$k' \
        --shard $k/$n --jobs ${JOBS:-3} --no-fail ${ZOO_FLAGS:-} \
        --reproduce '$reproduce (shard $k/$n)' \
        > '$RUN/shard$k.jsonl' 2> '$RUN/shard$k.err'
      echo \"zoo shard $k rc \$? at \$(date +%s)\" >> '$RUN/progress.log'
      if [ -n '$a' ]; then
        BUILD='$BUILD' bash bench/anchors/run_all.sh '$RUN/anchors_$a' $a
        echo \"anchors $a rc \$? at \$(date +%s)\" >> '$RUN/progress.log'
      fi
      touch '$RUN/shard$k.done'" > "$RUN/card$k.log" 2>&1 < /dev/null &
  done
  echo "started $n shards at $t0 in $RUN"
  ;;
run)
  # start, wait for the zoo shards (at most WAIT_S seconds, default 480),
  # collect into OUT_DIR: the whole tier in one device call.
  OUT=${3:?OUT_DIR}
  t_run=$(date +%s)
  bash "$0" start "$RUN" || exit 1
  n=${NGPU:-$(nvidia-smi -L | wc -l)}
  while [ $(( $(date +%s) - t_run )) -lt "${WAIT_S:-480}" ]; do
    done_shards=$(cat "$RUN/progress.log" 2>/dev/null | grep -c '^zoo shard')
    [ "$done_shards" -ge "$n" ] && break
    sleep 5
  done
  bash "$0" status "$RUN"
  bash "$0" collect "$RUN" "$OUT"
  ;;
status)
  cat "$RUN/progress.log" 2>/dev/null
  for f in "$RUN"/shard*.err; do
    [ -f "$f" ] && echo "$(basename "$f"): $(grep -c '^zoo: ' "$f") models done"
  done
  for d in "$RUN"/anchors_*; do
    [ -d "$d" ] && echo "$(basename "$d"): $(cat "$d/progress.log" 2>/dev/null | tr '\n' ';')"
  done
  ls "$RUN"/shard*.done 2>/dev/null | wc -l | sed 's/$/ cards done/'
  ;;
collect)
  OUT=${3:?OUT_DIR}
  mkdir -p "$OUT"
  # The shard folders only (shardK/): shardK.err, .jsonl and .done sit
  # beside them.
  python3 bench/zoo/run_zoo.py --merge "$RUN"/shard[0-9]*/ --out "$OUT" \
    --no-fail | cut -c1-2000
  for d in "$RUN"/anchors_*; do
    [ -d "$d" ] || continue
    tar czf "$OUT/$(basename "$d").tgz" -C "$d" --exclude=models --exclude='*.pt' .
  done
  tar czf "$OUT/logs.tgz" -C "$RUN" cards.txt progress.log models.log models/manifest.json \
    $(cd "$RUN" && ls shard*.err shard*.jsonl card*.log 2>/dev/null)
  cp "$RUN/cards.txt" "$OUT/"
  ls -la "$OUT"
  ;;
*)
  echo "run_gpu_cards.sh: unknown command $cmd (start, status or collect)" >&2
  exit 2
  ;;
esac
