#!/bin/bash
# GPU call 3: the whole GPU apply zoo, 4 shards sharing the one card (the
# memory, gradient and applied bars; not the time bar), from the source root.
source .gpu/device-env.sh
WORK=/tmp/az BUILD=/tmp/bg TRACE= PROBE= SHARDS=4 WAIT_S=540 \
  bash bench/apply/run_apply_zoo_gpu.sh start
OUT=$OUT bash bench/apply/run_apply_zoo_gpu.sh collect
