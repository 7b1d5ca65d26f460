#!/bin/bash
W=/tmp/g5; mkdir -p $W
python3 bench/apply/apply_memsnap.py --model swin_t --schedule scratch_gpu/sched/swin_t.1722067641B.schedule.json --out $W --variants eager,applied > $W/swin.log 2>&1 &
python3 bench/apply/apply_memsnap.py --model mobilenet_v3_large --schedule scratch_gpu/sched/mobilenet_v3_large.1236946459B.schedule.json --out $W --variants applied,applied_no_swaps > $W/mnv3.log 2>&1 &
wait
tar czf $OUT/g5.tgz -C $W .
cut -c1-2500 $W/*.log
