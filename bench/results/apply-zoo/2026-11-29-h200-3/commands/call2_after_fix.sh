#!/bin/bash
# GPU call 2: the swap-copy fix and the whole-step peak check, checked.
set -u
W=/tmp/g2; mkdir -p $W; SRC=$(pwd)
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > $OUT/cards.txt
# 1. the new CUDA tests with this tree's _apply.py and with HEAD's (before)
rm -rf /tmp/oldpy && cp -r client/python /tmp/oldpy && cp scratch_gpu/apply_old.py /tmp/oldpy/mutwo/_apply.py
(cd /tmp/oldpy && timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_apply.py -k "outlive or optimizer_step" 2>&1 | tail -25) > $OUT/pytest_before.txt
(cd client/python && timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_apply.py -k "outlive or optimizer_step" 2>&1 | tail -25) > $OUT/pytest_after.txt
# 2. the apply zoo's over-budget points, one child each (4 at once on the card)
run() { python3 bench/apply/apply_zoo_gpu.py --child --model $1 --schedule scratch_gpu/sched/$2 --eager --iterations 5 > $W/child_$1_$3.json 2> $W/child_$1_$3.err; }
run transformer_encoder transformer_encoder.1953524991B.schedule.json low &
run transformer_encoder transformer_encoder.2866752426B.schedule.json mid &
run moe moe.2740749618B.schedule.json low &
run densenet121 densenet121.1911034209B.schedule.json low &
wait
run alexnet alexnet.1299922147B.schedule.json low &
python3 bench/apply/apply_memsnap.py --model transformer_encoder --schedule scratch_gpu/sched/transformer_encoder.1953524991B.schedule.json --out $W/memsnap --variants applied > $W/memsnap.log 2>&1 &
# 3. the apply tests under torch 2.11
(cd client/python && timeout 400 python3 -m pytest -q -p no:cacheprovider tests/test_apply.py tests/test_apply_inputs.py 2>&1 | tail -15) > $OUT/pytest_apply_211.txt
wait
tar czf $OUT/g2.tgz -C $W .
cat $OUT/pytest_before.txt $OUT/pytest_after.txt | grep -E "passed|failed|FAILED|assert" | head -20
tail -3 $OUT/pytest_apply_211.txt
for f in $W/child_*.json; do python3 -c "
import json,sys
d=json.loads(open('$f').read().strip().splitlines()[-1])
print('$f'.split('/')[-1], 'peak', d.get('peak_bytes'), 'eager', d.get('eager_peak_bytes'), 'in/out', d.get('swapped_in'), d.get('swapped_out'), 'ms', d.get('step_ms'), d.get('eager_step_ms'), 'eq', d.get('gradients_equal'))
" 2>&1 | tail -1; done
cut -c1-1500 $W/memsnap.log
