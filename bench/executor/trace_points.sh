#!/bin/bash
# Chrome traces of the unmodified and the scheduled step of one model at
# several budgets, and their summaries (trace_summary.py): where a scheduled
# step's time goes on this device.
#
#   BUILD=/tmp/bg bench/executor/trace_points.sh OUT MODEL BUDGET...
#
# MODEL is one of bench/gpu/make_models.py's (resnet152, transformer, gpt,
# vit_b_16); BUDGET as `mutwo plan --budget` takes it (12GB, 45%, 4000000000B).
# Writes OUT/summary.jsonl (one line per trace, with model and budget),
# OUT/<budget>/{schedule.json,validation.json,trace/*.json} and OUT/card.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: trace_points.sh OUT MODEL BUDGET...}
MODEL=${2:?model}
shift 2
BUILD=${BUILD:-/tmp/bg}
mkdir -p "$OUT"
source bench/gpu/ensure_build.sh
MD=${MODELS_DIR:-$OUT/models}
[ -f "$MD/$MODEL.pt" ] || python3 bench/gpu/make_models.py "$MD" "$MODEL" 2>> "$OUT/models.log"
read -r -a FLAGS < <(python3 - "$MODEL" <<'PY'
import sys
sys.path.insert(0, "bench/gpu")
from make_models import SPECS
s = SPECS[sys.argv[1]]
print(" ".join([f"--input={i}" for i in s["inputs"]] +
               [f"--loss={s['loss']}", f"--batch={s['batch']}",
                "--device=cuda:0", "--optimizer=adam"]))
PY
)
"$BUILD/bin/mutwo-worker" profile "$MD/$MODEL.pt" "${FLAGS[@]}" --output json > "$OUT/profile.json" 2>> "$OUT/errors.log" || { echo "profile failed" >&2; exit 1; }
for budget in "$@"; do
  d="$OUT/$budget"
  mkdir -p "$d"
  "$BUILD/bin/mutwo" plan "$OUT/profile.json" --budget "$budget" --output json > "$d/schedule.json" 2>> "$OUT/errors.log"
  "$BUILD/bin/mutwo-worker" execute "$MD/$MODEL.pt" --schedule "$d/schedule.json" \
    --device cuda:0 --iterations 5 --output json --trace_dir "$d/trace" > "$d/validation.json" 2>> "$OUT/errors.log"
  echo "$MODEL $budget execute rc $?" >> "$OUT/progress.log"
  python3 bench/executor/trace_summary.py "$d/trace" | python3 -c '
import json, sys
for line in sys.stdin:
    row = json.loads(line)
    row["model"], row["budget"] = sys.argv[1], sys.argv[2]
    print(json.dumps(row, sort_keys=True))' "$MODEL" "$budget" >> "$OUT/summary.jsonl"
done
