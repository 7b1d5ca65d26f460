#!/bin/bash
# call 1: ViT-B/16 (card 0) and ResNet-152 (card 1) under compile with mutwo's policy.
set -u
source .gpu/device-env.sh
W=/tmp/anc; mkdir -p $W
{ cmake -S . -B /tmp/bg -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUTWO_BUILD_TESTS=OFF -DMUTWO_BUILD_BENCH=OFF > $W/build.log 2>&1 &&
  cmake --build /tmp/bg --target mutwo mutwo-worker >> $W/build.log 2>&1; } || { tail -30 $W/build.log; exit 1; }
echo built
CUDA_VISIBLE_DEVICES=0 TESTS=1 VERIFY=1 BUDGETS=6 POINTS=0 PLAN_FLAGS=--swap=false WARM_IN_PARALLEL=12 BUILD=/tmp/bg \
  setsid nohup bash bench/anchors/run_mutwo_compile.sh $W/vit_b_16 vit_b_16 > $W/vit.log 2>&1 < /dev/null &
CUDA_VISIBLE_DEVICES=1 TESTS=0 VERIFY=0 BUDGETS=6 POINTS=0 PLAN_FLAGS=--swap=false WARM_IN_PARALLEL=13 BUILD=/tmp/bg \
  setsid nohup bash bench/anchors/run_mutwo_compile.sh $W/resnet152 resnet152 > $W/rn.log 2>&1 < /dev/null &
sleep 5; echo started
