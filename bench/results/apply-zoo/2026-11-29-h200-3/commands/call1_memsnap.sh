#!/bin/bash
# GPU call 1: where the apply zoo's over-budget points peak (allocator history).
source .gpu/device-env.sh
export EXTRA="--models transformer_encoder,moe,densenet121,alexnet"
WORK=/tmp/az BUILD=/tmp/bg TRACE= PROBE= SHARDS=4 WAIT_S=450 \
  MEMSNAP=transformer_encoder,moe,densenet121,alexnet \
  bash bench/apply/run_apply_zoo_gpu.sh start
cp /tmp/az/memsnap.log $OUT/ 2>/dev/null
tar czf $OUT/memsnap.tgz -C /tmp/az memsnap 2>/dev/null
