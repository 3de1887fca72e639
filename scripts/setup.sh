#!/usr/bin/env bash
# Installs everything kiln needs from Debian's packages. Idempotent: does nothing when all are present.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  protobuf-compiler libprotobuf-dev libonnx-dev zlib1g-dev
  libcli11-dev nlohmann-json3-dev libdnnl-dev
  googletest libgtest-dev libbenchmark-dev
  clang-format
  clang libclang-rt-14-dev   # the libFuzzer targets (ASan + UBSan tree of tests/fuzz/run_fuzz_sanitized.sh)
  chromium
  python3-numpy python3-onnx python3-torch python3-torchvision
  python3-dev pybind11-dev python3-pybind11 python3-pytest python3-venv python3-pip python3-setuptools python3-wheel  # python/
  dataset-fashion-mnist      # the INT8 accuracy test and bench/fmnist (/usr/share/datasets/fashion-mnist)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
