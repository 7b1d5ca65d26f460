#!/bin/bash
# poll.sh MAXS: wait for /tmp/az/ALLDONE up to MAXS s, then tar into $OUT
W=/tmp/az
end=$(( $(date +%s) + $1 ))
if [ ! -d $W ]; then echo "NO RUN HERE"; exit 3; fi
while [ ! -f $W/ALLDONE ] && [ $(date +%s) -lt $end ]; do sleep 5; done
tail -5 $W/run.log
tar czf $OUT/az.tgz -C $W --exclude='*.pt' .
ls -la $OUT
