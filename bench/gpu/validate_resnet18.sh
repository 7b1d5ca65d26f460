#!/usr/bin/env bash
# The executor's first GPU check: torchvision ResNet-18 at batch 64 on one card,
# profiled, planned at three budgets (95%, 85%, 75% of the baseline peak;
# the planner's floor there is about 73%) and
# executed in real training steps; prints one JSON line per budget with the
# measured and predicted peak and time, and whether gradients match.
#   bench/gpu/validate_resnet18.sh BIN_DIR OUT_DIR [device]
set -euo pipefail
BIN=${1:?usage: validate_resnet18.sh BIN_DIR OUT_DIR [device]}
OUT=${2:?usage}
DEVICE=${3:-cuda:0}
mkdir -p "$OUT"
python3 - "$OUT/resnet18.pt" <<'PY'
import sys, torch, torchvision
torch.manual_seed(0)
m = torchvision.models.resnet18(weights=None)
m.train()
torch.jit.script(m).save(sys.argv[1])
PY
ARGS=(--input 'x:float32[B,3,224,224]' --loss 'cross_entropy:y:int64[B]{0,1000}'
      --optimizer adam --batch 64 --device "$DEVICE")
"$BIN/mutwo-worker" profile "$OUT/resnet18.pt" "${ARGS[@]}" --output json > "$OUT/resnet18_b64_profile.json"
for budget in 95% 85% 75%; do
  s="$OUT/resnet18_b64_${budget%\%}.schedule.json"
  "$BIN/mutwo" plan "$OUT/resnet18_b64_profile.json" --budget "$budget" --output json > "$s" || true
  "$BIN/mutwo-worker" execute "$OUT/resnet18.pt" --schedule "$s" "${ARGS[@]}" \
    --iterations 5 --output json > "$OUT/resnet18_b64_${budget%\%}.validation.json"
  python3 - "$budget" "$s" "$OUT/resnet18_b64_${budget%\%}.validation.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[2])); v = json.load(open(sys.argv[3]))
print(json.dumps({"budget": sys.argv[1], "budget_bytes": int(s["budget_bytes"]),
  "feasible": s["feasible"], "recomputed": s.get("recomputed", 0), "swapped": s.get("swapped", 0),
  "predicted_peak_bytes": int(s["predicted_peak_bytes"]), "measured_peak_bytes": int(v["scheduled"]["peak_bytes"]),
  "baseline_peak_bytes": int(v["baseline"]["peak_bytes"]),
  "predicted_ms": s["predicted_iteration_ms"], "measured_ms": v["scheduled"]["iteration_ms"],
  "baseline_ms": v["baseline"]["iteration_ms"], "within_budget": v["within_budget"],
  "gradients_match": v["gradients_match"], "max_abs_grad_diff": v["max_abs_grad_diff"]}))
PY
done
