#!/usr/bin/env bash
# The fault and abuse suite (crashes, kills, fuzzing, soak), long form
# (docs/reliability.md).
# The short form runs in CI as `ctest -L reliability`; this runs the same
# binaries at full size and prints their JSON figure lines.
#   scripts/fault-suite.sh [BUILD_DIR]
#   FUZZ_REQUESTS=100000 CRASH_ROUNDS=100 SOAK_ROUNDS=20000 \
#     scripts/fault-suite.sh                                      # defaults
# With the worker built, the hostile models (endless loop, memory bomb, zip
# bomb) run through the real server and worker daemon as well.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
FUZZ_REQUESTS=${FUZZ_REQUESTS:-100000}
CRASH_ROUNDS=${CRASH_ROUNDS:-100}
SOAK_ROUNDS=${SOAK_ROUNDS:-20000}
run() {
  echo "== $*" >&2
  local start=$SECONDS
  "$@" 2>&1 | grep -E '^\{|^\[  (PASSED|FAILED)|Failure' || true
  echo "   (${*: -1}: $((SECONDS - start)) s)" >&2
}
run "$BUILD/bin/atomic_writes_test"
run "$BUILD/bin/child_process_test"
run "$BUILD/bin/planner_test" --gtest_filter='BoundedPlanningTest.*'
MUTWO_FUZZ_REQUESTS=$FUZZ_REQUESTS run "$BUILD/bin/fuzz_test"
MUTWO_CRASH_ROUNDS=$CRASH_ROUNDS run "$BUILD/bin/crash_restart_test"
MUTWO_SOAK_ROUNDS=$SOAK_ROUNDS run "$BUILD/bin/rss_soak_test"
if [ -x "$BUILD/bin/service_e2e_test" ]; then
  run "$BUILD/bin/service_e2e_test" \
    --gtest_filter='ServiceTest.HostileModels*:ServiceTest.ZipBomb*'
fi
