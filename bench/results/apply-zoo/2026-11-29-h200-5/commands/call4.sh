#!/bin/bash
# call 4: call 1's over-budget schedules (resnet18 0.5, resnext50_32x4d 0.1)
# again with replays that defer a call whose output is gone: where the peak
# lies now (call 2 measured them before the change).
source .gpu/device-env.sh
W=/tmp/g4; mkdir -p $W
S=scratch_gpu/sched
python3 bench/apply/apply_memsnap.py --model resnet18 --schedule $S/resnet18.1409916951B.schedule.json --out $W --variants applied,applied_no_swaps > $W/r18.log 2>&1 &
python3 bench/apply/apply_memsnap.py --model resnext50_32x4d --schedule $S/resnext50_32x4d.1661433609B.schedule.json --out $W --variants applied > $W/rx50.log 2>&1 &
wait
tar czf $OUT/g4.tgz -C $W .
cut -c1-1200 $W/*.log
