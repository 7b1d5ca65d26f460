#!/usr/bin/env bash
# Generates the Python gRPC stubs of mutwo's API (proto/mutwo/v1/*.proto)
# that the `mutwo` package ships (mutwo/v1/*_pb2*.py), with protoc and
# Debian's grpc_python_plugin (packages protobuf-compiler,
# protobuf-compiler-grpc, python3-grpcio, python3-protobuf).
#   client/python/generate_stubs.sh --package [OUT_DIR]
#       into OUT_DIR/mutwo/v1 (default client/python). Run it after a
#       change to proto/: the python_stubs_fresh test fails until then.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
if [ "${1:-}" != "--package" ]; then
  echo "usage: generate_stubs.sh --package [OUT_DIR]  (the stubs of the mutwo package; the old mutwo_client.py and its gen/ stubs are gone)" >&2
  exit 2
fi
shift
out="${1:-$here}"
protoc_bin="${PROTOC:-protoc}"
plugin="${GRPC_PYTHON_PLUGIN:-$(command -v grpc_python_plugin || true)}"
if [ -z "$plugin" ] || [ ! -x "$plugin" ]; then
  echo "generate_stubs: grpc_python_plugin not found; install protobuf-compiler-grpc or set GRPC_PYTHON_PLUGIN" >&2
  exit 2
fi
command -v "$protoc_bin" >/dev/null || {
  echo "generate_stubs: protoc not found; install protobuf-compiler or set PROTOC" >&2
  exit 2
}
mkdir -p "$out"
gen() {
  "$protoc_bin" -I "$1" --python_out="$out" --grpc_python_out="$out" \
    --plugin=protoc-gen-grpc_python="$plugin" "${@:2}"
}
gen "$root/proto" "$root"/proto/mutwo/v1/*.proto
# mutwo/v1 is a regular package of the installed `mutwo`.
[ -f "$out/mutwo/v1/__init__.py" ] ||
  echo '"""Generated gRPC stubs of proto/mutwo/v1 (generate_stubs.sh --package)."""' \
    >"$out/mutwo/v1/__init__.py"
echo "generate_stubs: wrote $out/mutwo/v1" >&2
