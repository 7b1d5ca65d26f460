#!/usr/bin/env bash
# mutwo beside the anchors, in one run on one card: mutwo and every anchor on
# ResNet-152, the Transformer, the GPT-style decoder and ViT-B/16 at
# make_models.SPECS' batch sizes (64, 64, 16, 32), one model after the
# other, results written as each finishes:
#   bench/anchors/run_all.sh OUT_DIR [MODELS]     (default: all four)
# Builds mutwo and mutwo-worker into $BUILD (default /tmp/bg) against the
# installed PyTorch's LibTorch unless $BUILD/bin has them, scripts the models
# (bench/gpu/make_models.py), then per model: mutwo at 10 budgets from the
# floor to the baseline (bench/gpu/run_benchmark.py, each schedule executed
# in its own process beside the unmodified step), the anchors (eager,
# checkpoint per block and sqrt(n), torch.compile at 4 activation memory
# budgets; bench/anchors/anchors.py, each in a fresh process) and
# OUT_DIR/report.md + plots (bench/anchors/report.py). OUT_DIR/card.txt
# names the card. LOSS_KIND=chunked_cross_entropy runs mutwo's steps with
# that loss (docs/loss.md; the anchors keep F.cross_entropy). A whole run
# takes longer than one 10-minute device command: start it detached
# (setsid) and collect OUT_DIR while it runs;
# OUT_DIR/DONE marks the end.
# MUTWO_COMPILE_POINTS=N also measures N of mutwo's schedules under
# torch.compile (anchors.py's mutwo_compile points: the schedules the worker
# just planned, SWAP decisions kept on the device), so one run answers every
# anchor with the worker's points and mutwo's plan under the compiler.
# WARM_IN_PARALLEL=N: N anchor processes compile at once (anchors.py
# --warm_in_parallel; each is still timed alone).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: bench/anchors/run_all.sh OUT_DIR [MODELS]}
MODELS=${2:-resnet152,transformer,gpt,vit_b_16}
BUILD=${BUILD:-/tmp/bg}
mkdir -p "$OUT/mutwo"
source bench/gpu/ensure_build.sh
MD=${MODELS_DIR:-$OUT/models}
python3 bench/gpu/make_models.py "$MD" ${MODELS//,/ } 2> "$OUT/models.log"
for m in ${MODELS//,/ }; do
  t0=$(date +%s)
  batch=$(python3 -c "import sys; sys.path.insert(0, 'bench/gpu'); from make_models import SPECS; print(SPECS['$m']['batch'])")
  python3 bench/gpu/run_benchmark.py --bin "$BUILD/bin" --models_dir "$MD" \
    --out "$OUT/mutwo" --models "$m" --batches "$m=$batch" --budgets 10 \
    --iterations 5 --loss_kind "${LOSS_KIND:-cross_entropy}" 2>> "$OUT/mutwo.err"
  echo "$m mutwo rc $? $(( $(date +%s) - t0 )) s" >> "$OUT/progress.log"
  systems=eager,ckpt_block,ckpt_sqrt
  [ "${MUTWO_COMPILE_POINTS:-0}" -gt 0 ] && systems=$systems,mutwo_compile
  python3 bench/anchors/anchors.py --models "$m" --compile_budgets 1.0,0.5,0.2,0.05 \
    --systems "$systems" --mutwo_schedules "$OUT/mutwo" \
    --mutwo_compile_points "${MUTWO_COMPILE_POINTS:-0}" \
    --warm_in_parallel "${WARM_IN_PARALLEL:-1}" \
    --out "$OUT/anchors.jsonl" --iterations 10 > /dev/null 2>> "$OUT/anchors.err"
  echo "$m anchors rc $? $(( $(date +%s) - t0 )) s" >> "$OUT/progress.log"
  python3 bench/anchors/report.py --anchors "$OUT/anchors.jsonl" --mutwo "$OUT/mutwo" \
    --out "$OUT" > "$OUT/report.log" 2>&1
done
touch "$OUT/DONE"
