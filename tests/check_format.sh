#!/usr/bin/env bash
# Fails when any C++ source is not formatted per .clang-format (run clang-format -i to fix).
set -euo pipefail
cd "$1"
files=$(find src include tests examples bench python -name '*.cc' -o -name '*.h' -o -name '*.cu' 2>/dev/null | sort)
[ -n "$files" ] || exit 0
clang-format --dry-run --Werror $files
echo "format: $(echo "$files" | wc -l) files clean"
