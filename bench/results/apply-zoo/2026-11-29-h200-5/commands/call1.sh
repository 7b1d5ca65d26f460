#!/bin/bash
# call 1 (2026-11-29 session 5): the whole GPU apply zoo at 27e6e18 (frames
# hold views of kept concatenations, deferred inputs counted), 4 shards on
# the one card, planned with the bench's default optimizer.
source .gpu/device-env.sh
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > $OUT/cards.txt
WORK=/tmp/az BUILD=/tmp/bg TRACE= PROBE= SHARDS=4 WAIT_S=505 \
  bash bench/apply/run_apply_zoo_gpu.sh start 2>&1 | tail -40
