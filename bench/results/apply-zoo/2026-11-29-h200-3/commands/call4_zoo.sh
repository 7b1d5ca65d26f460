#!/bin/bash
# GPU call 4: the whole GPU apply zoo (27 models, 2 budgets), planned with
# adam:foreach and trained with torch.optim's default Adam, 4 shards on the
# one card; beside it the apply tests under torch 2.11.
source .gpu/device-env.sh
( cd client/python && timeout 500 python3 -m pytest -q -p no:cacheprovider \
    tests/test_apply.py tests/test_apply_inputs.py 2>&1 | tail -15 > $OUT/pytest_apply_211.txt ) &
WORK=/tmp/az BUILD=/tmp/bg TRACE= PROBE= SHARDS=4 WAIT_S=500 \
  bash bench/apply/run_apply_zoo_gpu.sh start
wait
tail -3 $OUT/pytest_apply_211.txt
