#!/bin/bash
# GPU call 6: budget-aware prefetch: the CUDA tests, then the swap points
# that missed (mobilenet_v3_large low) and the swap-heavy ones (gpt,
# transformer_encoder), one child each, schedules of call 4.
W=/tmp/g6; mkdir -p $W
(cd client/python && timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_apply.py -k "outlive or optimizer_step or prefetched or does_not_reach" 2>&1 | grep -E "^E  |passed|failed" | head -12) > $OUT/pytest_cuda.txt &
run() { python3 bench/apply/apply_zoo_gpu.py --child --model $1 --schedule $2 --iterations 5 > $W/child_$1_$3.json 2> $W/child_$1_$3.err; }
S=scratch_gpu/sched
run mobilenet_v3_large $S/mobilenet_v3_large.1236946459B.schedule.json low &
run gpt $S/gpt.low.schedule.json low &
run transformer_encoder $S/transformer_encoder.low.schedule.json low &
run gpt $S/gpt.mid.schedule.json mid &
wait
tar czf $OUT/g6.tgz -C $W .
cat $OUT/pytest_cuda.txt
for f in $W/child_*.json; do python3 -c "
import json
d=json.loads(open('$f').read().strip().splitlines()[-1])
print('$f'.split('/')[-1], 'peak', d.get('peak_bytes'), 'in/out', d.get('swapped_in'), d.get('swapped_out'), 'ms', d.get('step_ms'), 'eq', d.get('gradients_equal'), d.get('error','')[:200])
" 2>&1 | tail -1; done
# one process, interleaved: eager / this tree / 17ac2ee (prefetch without the budget check)
for m in gpt:gpt.low mobilenet_v3_large:mobilenet_v3_large.1236946459B; do
  python3 bench/apply/apply_zoo_gpu.py --ab --model ${m%%:*} --schedule $S/${m#*:}.schedule.json --before scratch_gpu/apply_17ac2ee.py --rounds 5 2>/dev/null | tail -1 | tee -a $OUT/ab.jsonl | cut -c1-400
done
