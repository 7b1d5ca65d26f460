#!/usr/bin/env bash
# The test command (README): bootstrap (install + build), check formatting,
# clang-tidy on the library files changed since TIDY_BASE (main; see
# scripts/clang-tidy.sh), then run every test with ctest. GPU-only tests
# carry the label `gpu` and are excluded when no NVIDIA GPU is visible. The image test (label `images`:
# builds the container images and runs them, tens of minutes, root) runs only
# when asked for by label, `scripts/test.sh -L images`, and only where buildah
# is installed. Other arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's wall time on stderr ("test.sh: build 612 s"), so that a slow
# CI says where its time went.
t_stage=$SECONDS
took() { echo "test.sh: $1 $((SECONDS - t_stage)) s" >&2; t_stage=$SECONDS; }
scripts/bootstrap.sh
took "bootstrap + build"
scripts/check-format.sh
BUILD_DIR=${BUILD_DIR:-build}
BUILD_DIR=$BUILD_DIR scripts/clang-tidy.sh
took "format + clang-tidy"

excluded=()
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  excluded+=(gpu)
fi
images_asked=0
prev=""
for arg in "$@"; do
  case "$prev" in
    -L | --label-regex) [[ "$arg" == *images* ]] && images_asked=1 ;;
  esac
  case "$arg" in
    -L*images* | --label-regex=*images*) images_asked=1 ;;
  esac
  prev=$arg
done
if [ "$images_asked" = 1 ] && ! command -v buildah >/dev/null 2>&1; then
  echo "test.sh: the images label needs buildah (apt-get install buildah podman debootstrap); not run" >&2
  images_asked=0
fi
[ "$images_asked" = 1 ] || excluded+=(images)

label_args=()
if [ ${#excluded[@]} -gt 0 ]; then
  label_args=(-LE "^($(IFS='|'; echo "${excluded[*]}"))\$")
fi
cd "$BUILD_DIR"
rc=0
ctest --output-on-failure -j"${CTEST_JOBS:-2}" "${label_args[@]}" "$@" || rc=$?
took "ctest"
exit "$rc"
