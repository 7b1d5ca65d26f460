#!/bin/bash
# GPU call 7: mutwo verify on AlexNet b64 at its floor, planned with adam and
# with adam:foreach (verify builds torch.optim's Adam as planned: fused, or
# foreach).
source .gpu/device-env.sh
set -u
W=/tmp/v7; mkdir -p $W; B=/tmp/bg
{ cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUTWO_BUILD_TESTS=OFF -DMUTWO_BUILD_BENCH=OFF -DCMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:-}" && cmake --build $B --target mutwo mutwo-worker; } > $W/build.log 2>&1 || { tail -20 $W/build.log; exit 1; }
cat > $W/alexnet.py <<'PY'
import torch, torchvision
def make():
    torch.manual_seed(0)
    return torchvision.models.alexnet()
PY
python3 -c "
import sys, torch; sys.path.insert(0, '$W'); import alexnet
torch.jit.script(alexnet.make()).save('$W/alexnet.pt')"
export PYTHONPATH=$PWD/client/python
for opt in adam adam:foreach; do
  t=${opt//:/_}
  $B/bin/mutwo-worker profile $W/alexnet.pt --input 'x:float32[B,3,224,224]' --batch 64 --loss 'cross_entropy:y:int64[B]{0,1000}' --optimizer $opt --device cuda:0 --output json > $W/$t.profile.json 2> $W/$t.profile.err
  floor=$($B/bin/mutwo plan $W/$t.profile.json --budget 1B --output json | python3 -c "import json,sys; print(int(json.load(sys.stdin)['floor_bytes']))")
  budget=$(( floor + floor / 2000 + 1 ))
  $B/bin/mutwo plan $W/$t.profile.json --budget ${budget}B --output json > $W/$t.schedule.json
  python3 -m mutwo verify $W/alexnet.py:make --schedule $W/$t.schedule.json --device cuda:0 --output json > $W/$t.verify.json 2> $W/$t.verify.err
  echo "$opt floor $floor budget $budget verify_rc $?"
  python3 -c "
import json; d=json.load(open('$W/$t.verify.json'))
print({k: d.get(k) for k in ('optimizer','budget_bytes','within_budget','gradients_match') if k in d})
s=json.dumps(d); print(s[:900])"
done
cp $W/*.json $W/*.err $OUT/ 2>/dev/null; rm -f $OUT/*.profile.json
