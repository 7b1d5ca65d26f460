#!/bin/bash
# GPU call 1 (MODELS=resnet50,googlenet,mobilenet_v2,resnet34): apply tests under torch 2.11; CNN points (frames that stop counting) + same-machine A/B
# against 24dee0e's package (scratch_gpu/before: git archive 24dee0e client/python/mutwo | tar x -C scratch_gpu/before), detached.
set -u
W=/tmp/az; B=/tmp/bg; SRC=$(pwd)
mkdir -p $W
{
t0=$(date +%s)
export PYTHONUNBUFFERED=1
(cd client/python && CUDA_VISIBLE_DEVICES= timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_apply.py tests/test_apply_inputs.py > $W/pytest_torch211.txt 2>&1) &
PYT=$!
cmake -S "$SRC" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUTWO_BUILD_TESTS=OFF -DMUTWO_BUILD_BENCH=OFF -DCMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:-}" > $W/build.log 2>&1 && cmake --build "$B" --target mutwo mutwo-worker >> $W/build.log 2>&1 || { echo BUILD FAILED; tail -30 $W/build.log; }
echo "built in $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > $W/cards.txt
python3 bench/apply/apply_zoo_gpu.py --bin $B/bin --out $W/shard0 --models ${MODELS} --no-fail
echo "points done $(( $(date +%s) - t0 )) s"
wait $PYT; tail -2 $W/pytest_torch211.txt
mkdir -p $W/ab
for m in $(echo ${MODELS} | tr , ' '); do
  for s in $(ls $W/shard0/$m.*B.schedule.json | sort -t. -k2,2n); do
    b=$(basename $s .schedule.json)
    batch=$(python3 -c "import json;print(json.load(open('$s'))['batch_size'])")
    for v in before after; do
      if [ $v = before ]; then export MUTWO_PY=$SRC/scratch_gpu/before/client/python; else unset MUTWO_PY; fi
      python3 bench/apply/apply_zoo_gpu.py --child --model $m --schedule $s --batch $batch --iterations 7 --eager 2>>$W/ab/child.err | tail -1 | sed "s/^{/{\"impl\": \"$v\", \"point\": \"$b\", /" >> $W/ab/ab.jsonl
    done
    unset MUTWO_PY
  done
  echo "ab $m done $(( $(date +%s) - t0 )) s"
done
echo "all done $(( $(date +%s) - t0 )) s"
} > $W/run.log 2>&1
touch $W/ALLDONE
