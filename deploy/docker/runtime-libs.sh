#!/usr/bin/env bash
# Lists or copies the shared libraries that built mutwo binaries need at run
# time, so the Dockerfile's slim runtime stages install exactly what the build
# linked (no second, hand-kept package list to rot).
#
#   runtime-libs.sh packages BIN...   Debian/Ubuntu packages that own the
#                                     libraries (for apt-get install), one a line
#   runtime-libs.sh copy DIR BIN...   copies the libraries into DIR (for a
#                                     runtime image of another distribution)
#
# Left out in both modes: the C runtime (glibc, libstdc++, libgcc_s: the
# runtime image has its own, as new or newer), the CUDA driver and toolkit
# libraries (the nvidia/cuda base image and the driver provide them) and
# anything under $RUNTIME_LIBS_SKIP (colon-separated prefixes, e.g. the pip
# PyTorch that is copied whole). Fails when a library cannot be resolved.
set -euo pipefail

usage() {
  echo "usage: $0 packages BIN... | $0 copy DIR BIN..." >&2
  exit 2
}
[ $# -ge 2 ] || usage
mode=$1
shift
dest=""
if [ "$mode" = copy ]; then
  dest=$1
  shift
  [ $# -ge 1 ] || usage
elif [ "$mode" != packages ]; then
  usage
fi

IFS=: read -r -a skip_prefixes <<<"${RUNTIME_LIBS_SKIP:-}"

libs() {
  local bin out
  for bin in "$@"; do
    [ -x "$bin" ] || { echo "runtime-libs: $bin: not an executable" >&2; exit 1; }
    out=$(ldd "$bin")
    # The CUDA driver library comes from the host's driver at run time; a
    # build machine without a GPU has none.
    missing=$(grep "not found" <<<"$out" | grep -vE "^\s*lib(cuda|nvidia-ml)\.so" || true)
    if [ -n "$missing" ]; then
      echo "runtime-libs: $bin: unresolved libraries:" >&2
      echo "$missing" >&2
      exit 1
    fi
    awk '$2 == "=>" && $3 ~ /^\// { print $3 }' <<<"$out"
  done | sort -u
}

skipped() {
  local path=$1 base prefix
  base=$(basename "$path")
  case "$base" in
    libc.so.* | libm.so.* | libdl.so.* | librt.so.* | libpthread.so.* | \
      ld-linux*.so.* | libresolv.so.* | libutil.so.* | libstdc++.so.* | \
      libgcc_s.so.* | libcuda.so.* | libnvidia-*.so.*)
      return 0
      ;;
  esac
  case "$path" in
    /usr/local/cuda*) return 0 ;;
  esac
  for prefix in "${skip_prefixes[@]}"; do
    [ -n "$prefix" ] && [[ "$path" == "$prefix"* ]] && return 0
  done
  return 1
}

owner() {
  # dpkg knows a file under the path it was packaged with; with merged /usr
  # that may be /lib/... while ldd says /usr/lib/... (or the reverse).
  local path=$1 real candidate
  real=$(readlink -f "$path")
  for candidate in "$path" "$real" "${path#/usr}" "${real#/usr}" "/usr$path" "/usr$real"; do
    if pkg=$(dpkg-query -S "$candidate" 2>/dev/null | head -1); then
      echo "${pkg%%:*}"
      return 0
    fi
  done
  echo "runtime-libs: no package owns $path" >&2
  return 1
}

all=$(libs "$@")
needed=()
while read -r lib; do
  [ -n "$lib" ] && ! skipped "$lib" && needed+=("$lib")
done <<<"$all"
if [ "$mode" = packages ]; then
  owners=()
  for lib in "${needed[@]}"; do owners+=("$(owner "$lib")"); done
  printf '%s\n' "${owners[@]}" | sort -u
else
  mkdir -p "$dest"
  for lib in "${needed[@]}"; do cp -L "$lib" "$dest/$(basename "$lib")"; done
fi
