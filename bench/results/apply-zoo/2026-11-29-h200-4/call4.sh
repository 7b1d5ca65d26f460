#!/bin/bash
# call 4: densenet121 in the GPU apply zoo with frames holding views of kept concatenations.
set -u
source .gpu/device-env.sh
mkdir -p $OUT
t0=$(date +%s)
{ cmake -S . -B /tmp/bg -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUTWO_BUILD_TESTS=OFF -DMUTWO_BUILD_BENCH=OFF > $OUT/build.log 2>&1 &&
  cmake --build /tmp/bg --target mutwo mutwo-worker >> $OUT/build.log 2>&1; } || { tail -30 $OUT/build.log; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 timeout -s INT 150 python3 bench/apply/apply_zoo_gpu.py --bin /tmp/bg/bin --out $OUT/dn --models densenet121 --no-fail > $OUT/dn.log 2>&1
echo "rc $?"; tail -2 $OUT/dn.log | cut -c1-300
cat $OUT/dn/table.md 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/card.txt
