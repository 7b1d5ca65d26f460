#!/bin/bash
# call 2: where the peak lies at call 1's three over-budget points.
source .gpu/device-env.sh
W=/tmp/g2; mkdir -p $W
S=scratch_gpu/sched
M=$(ls $S/moe.*B.schedule.json | sort -t. -k2,2n | head -1)
python3 bench/apply/apply_memsnap.py --model resnet18 --schedule $S/resnet18.1409916951B.schedule.json --out $W --variants eager,applied,applied_no_swaps > $W/r18.log 2>&1 &
python3 bench/apply/apply_memsnap.py --model resnext50_32x4d --schedule $S/resnext50_32x4d.1661433609B.schedule.json --out $W --variants eager,applied > $W/rx50.log 2>&1 &
python3 bench/apply/apply_memsnap.py --model moe --schedule $M --out $W --variants applied,applied_no_swaps > $W/moe.log 2>&1 &
wait
tar czf $OUT/g2.tgz -C $W .
cut -c1-1500 $W/*.log
