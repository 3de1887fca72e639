#!/usr/bin/env bash
# Fails when any C++ source is not formatted per .clang-format (run clang-format -i to fix).
set -euo pipefail
cd "$1"
dirs=$(for d in src include tests examples bench python; do [ -d "$d" ] && echo "$d"; done)
files=$(find $dirs \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cpp' \) | sort)
[ -n "$files" ] || exit 0
clang-format --dry-run --Werror $files
echo "format: $(echo "$files" | wc -l) files clean"
