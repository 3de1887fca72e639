#!/usr/bin/env bash
# Configures and builds kiln in build/ (Release). Extra arguments go to ninja (targets).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
ninja -C build "$@"
