#!/usr/bin/env bash
# Formats every tracked C++ file in place with clang-format.
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files '*.cc' '*.h' | xargs -r clang-format -i
