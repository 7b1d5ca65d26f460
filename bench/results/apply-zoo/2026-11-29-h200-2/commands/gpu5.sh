#!/bin/bash
# GPU call 2: interleaved in-process A/B (eager / after / before=24dee0e) of the CNN schedules of call 1.
# Before it: mkdir -p scratch_gpu/sched && tar xzf ../cnn-points/schedules.tgz -C scratch_gpu/sched
#            git show 24dee0e:client/python/mutwo/_apply.py > scratch_gpu/apply_24dee0e.py
set -u
W=/tmp/az; SRC=$(pwd)
mkdir -p $W/ab2
{
t0=$(date +%s)
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > $W/cards.txt
for rep in 1 2; do
  for s in scratch_gpu/sched/*.schedule.json; do
    m=$(basename $s | cut -d. -f1)
    python3 bench/apply/apply_zoo_gpu.py --ab --model $m --schedule $s --rounds 7 --iterations 5 --before scratch_gpu/apply_24dee0e.py 2>>$W/ab2/err.txt | tail -1 >> $W/ab2/ab.jsonl
    echo "$rep $m $(( $(date +%s) - t0 )) s"
  done
done
echo "all done $(( $(date +%s) - t0 )) s"
} > $W/run.log 2>&1
touch $W/ALLDONE
