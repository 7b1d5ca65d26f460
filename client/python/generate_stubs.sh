#!/usr/bin/env bash
# Generates the Python gRPC stubs of mutwo's API (proto/mutwo/v1/*.proto and
# grpc.health.v1) with protoc and Debian's grpc_python_plugin
# (packages protobuf-compiler, protobuf-compiler-grpc, python3-grpcio,
# python3-protobuf).
#   client/python/generate_stubs.sh            # into client/python/gen/
#   client/python/generate_stubs.sh OUT_DIR    # anywhere else
#   client/python/generate_stubs.sh --package [OUT_DIR]
#       the stubs the `mutwo` package ships (mutwo/v1/*_pb2*.py under
#       OUT_DIR, default client/python; no grpc_health). Run it after a
#       change to proto/: the python_stubs_fresh test fails until then.
# mutwo_client.py finds them in $MUTWO_PY_STUBS or client/python/gen/.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
package=0
if [ "${1:-}" = "--package" ]; then
  package=1
  shift
  out="${1:-$here}"
else
  out="${1:-$here/gen}"
fi
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
if [ "$package" = 1 ]; then
  # mutwo/v1 is a regular package of the installed `mutwo`.
  [ -f "$out/mutwo/v1/__init__.py" ] ||
    echo '"""Generated gRPC stubs of proto/mutwo/v1 (generate_stubs.sh --package)."""' \
      >"$out/mutwo/v1/__init__.py"
  echo "generate_stubs: wrote $out/mutwo/v1" >&2
  exit 0
fi
# grpc.health.v1 as the module grpc_health.v1.health_pb2 (the layout of the
# grpcio-health-checking package): a generated `grpc/` folder would be
# shadowed by grpcio's own `grpc` package. The proto package, and so the
# service name on the wire, stays grpc.health.v1.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/grpc_health/v1"
cp "$root/proto/grpc/health/v1/health.proto" "$tmp/grpc_health/v1/health.proto"
gen "$tmp" "$tmp/grpc_health/v1/health.proto"
echo "generate_stubs: wrote $out" >&2
