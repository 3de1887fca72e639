#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds, runs every test (unit, conformance with its
# regression list, CLI end-to-end, PyTorch parity, formatting, fuzzing under ASan/UBSan).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j2 "$@"
