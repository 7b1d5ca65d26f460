#!/bin/bash
# call 6: the whole GPU apply zoo after each op of a kind a module's forward
# makes takes its own decision (671cfca); beside it the apply tests under
# torch 2.11.
source .gpu/device-env.sh
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > $OUT/cards.txt
( cd client/python && timeout 500 python3 -m pytest -q -p no:cacheprovider \
    tests/test_apply.py tests/test_apply_inputs.py 2>&1 | tail -15 > $OUT/pytest_apply_211.txt ) &
WORK=/tmp/az BUILD=/tmp/bg TRACE= PROBE= SHARDS=4 WAIT_S=505 \
  bash bench/apply/run_apply_zoo_gpu.sh start 2>&1 | tail -40
wait
tail -3 $OUT/pytest_apply_211.txt
