# Sourced by the GPU benchmark scripts (bench/anchors/run_all.sh,
# bench/executor/trace_points.sh): records the card in $OUT/card.txt and
# builds mutwo and mutwo-worker into $BUILD against the installed PyTorch's
# LibTorch unless $BUILD/bin/mutwo-worker exists (log: $OUT/build.log).
# Needs OUT and BUILD set, and the source root as the working directory.
nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv > "$OUT/card.txt" 2>&1
if [ ! -x "$BUILD/bin/mutwo-worker" ]; then
  export CMAKE_PREFIX_PATH=${CMAKE_PREFIX_PATH:-$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')}
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMUTWO_BUILD_TESTS=OFF > "$OUT/build.log" 2>&1 &&
    cmake --build "$BUILD" --target mutwo mutwo-worker >> "$OUT/build.log" 2>&1 || { echo "build failed" >&2; exit 1; }
fi
