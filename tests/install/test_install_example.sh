#!/usr/bin/env bash
# `cmake --install` and find_package(mutwo), as a C++ user links the library:
# installs the build into a temporary prefix, builds examples/libtorch_train
# against it alone, plans a schedule for a small CNN with batch norm and dropout
# (mutwo-worker profile, mutwo plan), trains with it in the example's own
# loop and checks every step's gradients equal the plain step's; then a
# schedule of another model is refused.
#   test_install_example.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1
build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log"
test -f "$tmp/prefix/include/mutwo/scheduled_step.h"
test -f "$tmp/prefix/lib/cmake/mutwo/mutwoConfig.cmake"

cat >"$tmp/make_models.py" <<'PY'
import sys, torch, torch.nn as nn
class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width),
            nn.ReLU(), nn.Dropout(0.2),
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU())
        self.fc = nn.Linear(width, 10)
    def forward(self, x):
        return self.fc(self.features(x).mean(dim=(2, 3)))
class Other(Net):  # one more layer: another graph
    def forward(self, x):
        return self.fc(torch.tanh(self.features(x).mean(dim=(2, 3))))
torch.manual_seed(0)
torch.jit.script(Net(16)).save(sys.argv[1] + "/model.pt")
# (A model differing only in widths has the same graph fingerprint: the
# fingerprint hashes op kinds and edges, not shapes.)
torch.jit.script(Other(16)).save(sys.argv[1] + "/other.pt")
PY
/usr/bin/python3 "$tmp/make_models.py" "$tmp"  # scripting reads the source
for m in model other; do
  "$build/bin/mutwo-worker" profile "$tmp/$m.pt" --input 'x:float32[B,3,16,16]' \
    --batch 4 --loss 'cross_entropy:y:int64[B]{0,10}' --output json \
    >"$tmp/$m.profile.json"
  "$build/bin/mutwo" plan "$tmp/$m.profile.json" --budget 85% --output json \
    >"$tmp/$m.schedule.json"
done
grep -q '"RECOMPUTE"' "$tmp/model.schedule.json" ||
  { echo "no recomputation planned at 85%"; exit 1; }

# The training loop's libraries need no gRPC (nor prometheus-cpp or
# OpenSSL): the example is configured with them made unfindable.
cmake -S "$src/examples/libtorch_train" -B "$tmp/example" -G Ninja \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_DISABLE_FIND_PACKAGE_gRPC=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_prometheus-cpp=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_OpenSSL=ON \
  ${CMAKE_CXX_COMPILER_LAUNCHER:+-DCMAKE_CXX_COMPILER_LAUNCHER=$CMAKE_CXX_COMPILER_LAUNCHER} \
  >"$tmp/configure.log" || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/example" >"$tmp/build.log" || { cat "$tmp/build.log"; exit 1; }

# The worker's command-line library is the component `worker`, with gRPC.
mkdir -p "$tmp/worker_component"
cat >"$tmp/worker_component/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.20)
project(mutwo_worker_component LANGUAGES CXX)
find_package(mutwo REQUIRED COMPONENTS worker)
if(NOT TARGET mutwo::mutwo_worker OR NOT TARGET mutwo::mutwo_train)
  message(FATAL_ERROR "find_package(mutwo COMPONENTS worker): no mutwo::mutwo_worker")
endif()
CMAKE
cmake -S "$tmp/worker_component" -B "$tmp/worker_component/build" \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/component.log" 2>&1 ||
  { cat "$tmp/component.log"; exit 1; }

"$tmp/example/train" "$tmp/model.pt" "$tmp/model.schedule.json" 3 | tee "$tmp/train.log"
grep -q "gradients equal" "$tmp/train.log"
grep -Eq "schedule: [1-9][0-9]* recomputed" "$tmp/train.log"

if "$tmp/example/train" "$tmp/model.pt" "$tmp/other.schedule.json" 1 \
    >"$tmp/other.log" 2>&1; then
  echo "a schedule of another model was accepted"; cat "$tmp/other.log"; exit 1
fi
grep -q "graph fingerprint" "$tmp/other.log" || { cat "$tmp/other.log"; exit 1; }
echo "install example: OK"
