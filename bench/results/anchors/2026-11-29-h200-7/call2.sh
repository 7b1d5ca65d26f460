#!/bin/bash
# call 2: the new CUDA tests, then ResNet-152 alone on the card (schedules of call 1).
set -u
source .gpu/device-env.sh
W=/tmp/anc2; mkdir -p $W
export PYTHONPATH=$PWD/client/python:$PWD/client/python/tests
( cd client/python && timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_apply.py tests/test_verify.py \
   -k "peak_reset or optimizer_step or mode_compile or copies_back" > $W/pytest_cuda.txt 2>&1 ); tail -3 $W/pytest_cuda.txt
MUTWO_DIR=$PWD/scratch_gpu/rn_sched TESTS=0 VERIFY=1 POINTS=0 WARM_IN_PARALLEL=7 BUILD=/tmp/bg \
  setsid nohup bash bench/anchors/run_mutwo_compile.sh $W/resnet152 resnet152 > $W/rn.log 2>&1 < /dev/null &
sleep 2; echo started
