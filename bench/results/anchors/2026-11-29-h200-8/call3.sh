#!/bin/bash
# call 3: ResNet-152 alone, the schedules of call 1, every point timed in 5 rounds.
set -u
source .gpu/device-env.sh
W=/tmp/anc3; mkdir -p $W
MUTWO_DIR=$PWD/scratch_gpu/rn_sched TESTS=0 VERIFY=0 POINTS=0 WARM_IN_PARALLEL=7 ROUNDS=5 BUILD=/tmp/bg \
  setsid nohup bash bench/anchors/run_mutwo_compile.sh $W/resnet152 resnet152 > $W/rn.log 2>&1 < /dev/null &
sleep 2; echo started
