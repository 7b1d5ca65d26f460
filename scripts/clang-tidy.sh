#!/usr/bin/env bash
# clang-tidy (.clang-tidy) over the libraries' C++ files that differ from a
# base commit, with the build's compile_commands.json; any finding fails.
#   scripts/clang-tidy.sh                  # changed vs TIDY_BASE (main)
#   TIDY_BASE=HEAD~3 scripts/clang-tidy.sh
#   scripts/clang-tidy.sh --all            # every library file (LibTorch
#                                          # headers make the worker's slow:
#                                          # tens of minutes on 2 cores)
#   scripts/clang-tidy.sh FILE...          # just these
# Files of a target the build did not configure (the worker without
# MUTWO_BUILD_WORKER) are skipped, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
command -v clang-tidy >/dev/null || { echo "clang-tidy: not installed (scripts/bootstrap.sh installs it)" >&2; exit 1; }
db="$BUILD_DIR/compile_commands.json"
[ -f "$db" ] || { echo "clang-tidy: no $db; configure the build first" >&2; exit 1; }

# The folders whose code clang-tidy checks (STYLE.md: it runs on the
# libraries); tests, benchmarks and examples are not checked.
folders='^(common|planner|server|client|worker|storage)/.*\.cc$'
files=()
if [ "${1:-}" = "--all" ]; then
  mapfile -t files < <(git ls-files | grep -E "$folders" || true)
elif [ $# -gt 0 ]; then
  files=("$@")
else
  base=${TIDY_BASE:-main}
  if ! git rev-parse -q --verify "$base^{commit}" >/dev/null; then
    echo "clang-tidy: base $base is not a commit here (set TIDY_BASE); not run" >&2
    exit 0
  fi
  mapfile -t files < <( { git diff --name-only --diff-filter=d "$(git merge-base "$base" HEAD)" -- ;
                         git ls-files --others --exclude-standard; } |
                       grep -E "$folders" | sort -u || true)
fi
[ ${#files[@]} -gt 0 ] || { echo "clang-tidy: no library file changed" >&2; exit 0; }

checked=()
for f in "${files[@]}"; do
  if grep -q "\"file\": \"$(pwd)/$f\"" "$db"; then
    checked+=("$f")
  else
    echo "clang-tidy: $f is not in $db (not configured in this build); skipped" >&2
  fi
done
[ ${#checked[@]} -gt 0 ] || exit 0
echo "clang-tidy: ${#checked[@]} file(s)" >&2
# One process per file, two at a time; a file's findings print together.
printf '%s\n' "${checked[@]}" |
  xargs -P "${TIDY_JOBS:-2}" -I{} clang-tidy -p "$BUILD_DIR" --quiet \
    --warnings-as-errors='*' {} ||
  { echo "clang-tidy: findings above (fix them, or NOLINT with the reason)" >&2; exit 1; }
echo "clang-tidy: ok" >&2
