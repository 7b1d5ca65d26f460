#!/bin/bash
# GPU call 3: A/B traces (before e8fc71e vs after) of the same schedules, one machine, interleaved.
# Before: mkdir -p scratch_gpu/before && git archive e8fc71e client/python/mutwo | tar x -C scratch_gpu/before
set -u
W=/tmp/az; B=/tmp/bg; SRC=$(pwd)
mkdir -p $W
{
t0=$(date +%s)
cmake -S "$SRC" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUTWO_BUILD_TESTS=OFF -DMUTWO_BUILD_BENCH=OFF -DCMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:-}" > $W/build.log 2>&1 && cmake --build "$B" --target mutwo mutwo-worker >> $W/build.log 2>&1 || { echo BUILD FAILED; tail -30 $W/build.log; }
echo "built in $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > $W/cards.txt
export PYTHONUNBUFFERED=1
python3 bench/apply/apply_zoo_gpu.py --bin $B/bin --out $W/shard0 --models ${MODELS} --no-fail
echo "points done $(( $(date +%s) - t0 )) s"
for m in $(echo ${MODELS} | tr , ' '); do
  for s in $(ls $W/shard0/$m.*B.schedule.json | sort -t. -k2,2n); do
    b=$(basename $s .schedule.json)
    for round in 1 2; do
      python3 bench/apply/apply_zoo_gpu.py --trace --model $m --schedule $s --out $W/ab/after$round/$b | tail -1
      MUTWO_PY=$SRC/scratch_gpu/before/client/python python3 bench/apply/apply_zoo_gpu.py --trace --model $m --schedule $s --out $W/ab/before$round/$b | tail -1
    done
  done
done
echo "all done $(( $(date +%s) - t0 )) s"
} > $W/run.log 2>&1
touch $W/ALLDONE
