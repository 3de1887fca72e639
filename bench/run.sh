#!/usr/bin/env bash
# kiln vs ONNX Runtime vs PyTorch eager, medians measured in one run (see bench/README.md).
#
#   bench/run.sh            resnet50, mobilenet_v2, bert_encoder (12 layers, seq 128) x batch 1, 8 x threads 1, 2
#   bench/run.sh --quick    batch 1 only, fewer iterations: a few minutes
#   Extra arguments go to bench/bench.py (e.g. --models mobilenet_v2 --batches 1 --threads 1).
#   bench/run.sh --int8     INT8 rows: kiln vs ONNX Runtime on ONNX Runtime's own INT8 files (resnet50 and
#                           mobilenet_v2 Q/DQ, the BERT encoder's dynamic INT8; ../shared/data/qdq) x batch 1, 8,
#                           2 threads, and kiln's own INT8 builds of the FP32 exports (--int8, calibrated on the
#                           exports' fixed inputs, cached) against the same ONNX Runtime files: 12 rows;
#                           --models also takes resnet18_fmnist_int8, mobilenet_v2_fmnist_int8
#   bench/run.sh --suite [--models a,b|family] [--batch 1,8] [--quick] [--findings FILE] ...
#                           the broad model suite (bench/suite/): ~40 models, kiln vs ORT, 2 threads
#
# Installs what it needs on a fresh Debian machine: onnxruntime-node from the npm registry (with
# --ignore-scripts, into bench/node_modules; its CPU library is bundled), Debian's OpenBLAS unpacked
# into bench/.deps for PyTorch only (Debian's python3-torch otherwise runs on whatever libblas.so.3 the
# system selects, often netlib's reference BLAS), python3-matplotlib for the chart (when root), and
# builds kiln when build/kiln is missing. Output: the table on stdout, bench/out/results.{json,png}.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HERE")"
PY=/usr/bin/python3
OUT="${BENCH_OUT:-$HERE/out}"
KILN="${KILN:-$ROOT/build/kiln}"
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="$(command -v sudo || true)"

QUICK=0; SUITE=0; INT8=0; ARGS=()
for a in "$@"; do
  if [ "$a" = "--quick" ]; then QUICK=1; elif [ "$a" = "--suite" ]; then SUITE=1;
  elif [ "$a" = "--int8" ]; then INT8=1; else ARGS+=("$a"); fi
done

say() { echo "[bench] $*" >&2; }

# --- peers
command -v node >/dev/null && command -v npm >/dev/null || {
  say "installing nodejs/npm (Debian)"; $SUDO apt-get update -qq; $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null; }
if [ ! -d "$HERE/node_modules/onnxruntime-node" ]; then
  say "installing onnxruntime-node (npm, --ignore-scripts)"
  (cd "$HERE" && npm install --ignore-scripts --no-audit --no-fund >/dev/null)
fi
[ "$INT8" = 1 ] || $PY -c "import torch, torchvision, onnx" 2>/dev/null || {
  say "installing python3-torch, python3-torchvision, python3-onnx (Debian)"
  $SUDO apt-get update -qq; $SUDO apt-get install -y -qq --no-install-recommends python3-torch python3-torchvision python3-onnx >/dev/null; }
if [ "$SUITE" = 0 ] && [ "$INT8" = 0 ] && ! $PY -c "import matplotlib" 2>/dev/null; then  # the suite draws no chart
  if [ -n "$SUDO" ] || [ "$(id -u)" = 0 ]; then
    say "installing python3-matplotlib (Debian) for the chart"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-matplotlib >/dev/null || say "no matplotlib: no chart"
  else say "python3-matplotlib missing and not root: no chart"; fi
fi
BLAS_DIR="$HERE/.deps/usr/lib/x86_64-linux-gnu/openblas-pthread"
if [ "$INT8" = 0 ] && [ ! -e "$BLAS_DIR/libblas.so.3" ]; then
  say "fetching Debian's libopenblas0-pthread for PyTorch (unpacked into bench/.deps, system untouched)"
  tmp="$(mktemp -d)"
  if (cd "$tmp" && apt-get download libopenblas0-pthread >/dev/null 2>&1) ||
     { $SUDO apt-get update -qq && (cd "$tmp" && apt-get download libopenblas0-pthread >/dev/null 2>&1); }; then
    dpkg-deb -x "$tmp"/libopenblas0-pthread_*.deb "$HERE/.deps"
  else say "could not fetch OpenBLAS: PyTorch uses the system's libblas.so.3 (the table says which)"; fi
  rm -rf "$tmp"
fi
[ -e "$BLAS_DIR/libblas.so.3" ] || BLAS_DIR=""

# --- kiln
if [ ! -x "$KILN" ]; then
  say "building kiln"
  cmake -S "$ROOT" -B "$ROOT/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  ninja -C "$ROOT/build" kiln >/dev/null
fi

# --- the broad model suite: its own runner (exports into OUT/suite/models, cached)
if [ "$SUITE" = 1 ]; then
  [ "$QUICK" = 1 ] && ARGS+=("--quick")
  exec $PY "$HERE/suite/suite.py" --kiln "$KILN" --out "$OUT/suite" --blas-dir "$BLAS_DIR" ${ARGS[@]+"${ARGS[@]}"}
fi

# --- INT8 rows: the quantized files as they are (nothing to export)
if [ "$INT8" = 1 ]; then
  if [ "$QUICK" = 1 ]; then set -- --batches 1 --warmup 2 --iterations 10; else set -- --warmup 5 --iterations 30; fi
  # kiln's own INT8 builds calibrate the FP32 exports (cached)
  mkdir -p "$OUT/models"
  for m in resnet50 mobilenet_v2 bert_encoder; do
    [ -s "$OUT/models/$m.onnx" ] || { say "exporting $m"; $PY "$ROOT/scripts/export_torch_model.py" "$m" "$OUT/models" >/dev/null; }
  done
  exec $PY "$HERE/bench.py" --kiln "$KILN" --models-dir "$OUT/models" --out "$OUT/int8" \
    --models resnet50_int8,mobilenet_v2_int8,bert_int8,resnet50_own_int8,mobilenet_v2_own_int8,bert_own_int8 \
    --threads 2 "$@" ${ARGS[@]+"${ARGS[@]}"}
fi

# --- models (cached)
MODELS="$OUT/models"; mkdir -p "$MODELS"
for m in resnet50 mobilenet_v2 bert_encoder; do
  [ -s "$MODELS/$m.onnx" ] || { say "exporting $m"; $PY "$ROOT/scripts/export_torch_model.py" "$m" "$MODELS" >/dev/null; }
done

if [ "$QUICK" = 1 ]; then
  set -- --batches 1 --warmup 2 --iterations 10
else
  set -- --warmup 5 --iterations 30
fi
exec $PY "$HERE/bench.py" --kiln "$KILN" --models-dir "$MODELS" --out "$OUT" --blas-dir "$BLAS_DIR" "$@" ${ARGS[@]+"${ARGS[@]}"}
