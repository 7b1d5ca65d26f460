set -u
source .gpu/device-env.sh
nvidia-smi --query-gpu=name --format=csv > $OUT/card.txt
( cmake -S . -B /tmp/b1 -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUTWO_BUILD_TESTS=OFF > $OUT/build1.log 2>&1 && cmake --build /tmp/b1 --target mutwo mutwo-worker >> $OUT/build1.log 2>&1; echo "b1 $?" >> $OUT/progress.log ) &
( cmake -S old_src -B /tmp/b0 -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUTWO_BUILD_TESTS=OFF > $OUT/build0.log 2>&1 && cmake --build /tmp/b0 --target mutwo mutwo-worker >> $OUT/build0.log 2>&1; echo "b0 $?" >> $OUT/progress.log ) &
python3 bench/gpu/make_models.py /tmp/md resnet152 transformer gpt vit_b_16 2> $OUT/models.log
wait
echo "built $(date +%T)" >> $OUT/progress.log
i=0
mkdir -p /tmp/res
for m in $MODELS; do
  CUDA_VISIBLE_DEVICES=$i timeout $TMO python3 bench/executor/step_overhead.py --bins new=/tmp/b1/bin,old=/tmp/b0/bin --model $m --models_dir /tmp/md --out /tmp/so --positions $POS --iterations 10 > /tmp/res/$m.jsonl 2> /tmp/res/$m.err &
  i=$((i+1))
done
wait
echo "done $(date +%T)" >> $OUT/progress.log
tar -czf $OUT/res.tgz -C /tmp res
