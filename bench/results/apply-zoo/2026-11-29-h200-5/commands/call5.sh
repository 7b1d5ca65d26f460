#!/bin/bash
# call 5: each op of a kind in a module's forward takes its own decision
# (MoE's per-expert index_select and mul): call 3's two MoE schedules in
# the allocator history, and the GPU apply zoo's MoE points planned afresh.
source .gpu/device-env.sh
W=/tmp/g5; mkdir -p $W
S=scratch_gpu/sched
python3 bench/apply/apply_memsnap.py --model moe --schedule $S/moe_low_call3.2931226186B.schedule.json --out $W/low --variants applied > $W/moe_low.log 2>&1 &
python3 bench/apply/apply_memsnap.py --model moe --schedule $S/moe_mid_call3.3227757211B.schedule.json --out $W/mid --variants applied > $W/moe_mid.log 2>&1 &
t0=$(date +%s)
{ cmake -S . -B /tmp/bg -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUTWO_BUILD_TESTS=OFF -DMUTWO_BUILD_BENCH=OFF > $W/build.log 2>&1 &&
  cmake --build /tmp/bg --target mutwo mutwo-worker >> $W/build.log 2>&1; } || { tail -30 $W/build.log; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
wait
PYTHONUNBUFFERED=1 timeout -s INT 300 python3 bench/apply/apply_zoo_gpu.py --bin /tmp/bg/bin --out $W/zoo --models moe --no-fail > $W/zoo.log 2>&1
echo "zoo rc $?"
tar czf $OUT/g5.tgz -C $W --exclude='*.pt' --exclude='*.profile.json' .
cut -c1-700 $W/moe_*.log
cat $W/zoo/table.md 2>/dev/null; tail -3 $W/zoo.log | cut -c1-600
