#!/bin/bash
# GPU call 1: apply zoo subset + traces at both budgets (detached).
set -u
W=/tmp/az; B=/tmp/bg; SRC=$(pwd)
mkdir -p $W
{
t0=$(date +%s)
cmake -S "$SRC" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUTWO_BUILD_TESTS=OFF -DMUTWO_BUILD_BENCH=OFF -DCMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:-}" > $W/build.log 2>&1 && cmake --build "$B" --target mutwo mutwo-worker >> $W/build.log 2>&1 || { echo BUILD FAILED; tail -30 $W/build.log; }
echo "built in $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > $W/cards.txt
export PYTHONUNBUFFERED=1
(cd client/python && timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_apply.py tests/test_apply_inputs.py > $W/pytest_torch211.txt 2>&1; tail -3 $W/pytest_torch211.txt)
python3 bench/apply/apply_zoo_gpu.py --bin $B/bin --out $W/shard0 --models ${MODELS} --specialize transformer_encoder --no-fail
echo "points done $(( $(date +%s) - t0 )) s"
for m in $(echo ${TRACES} | tr , ' '); do
  for s in $(ls $W/shard0/$m.*B.schedule.json | sort -t. -k2,2n); do
    b=$(basename $s .schedule.json)
    python3 bench/apply/apply_zoo_gpu.py --trace --model $m --schedule $s --out $W/trace_$b || true
  done
done
echo "all done $(( $(date +%s) - t0 )) s"
} > $W/run.log 2>&1
touch $W/ALLDONE
