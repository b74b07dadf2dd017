#!/usr/bin/env bash
# Issue 13's figures in one go, every peer in the same run (HF transformers from the test extra,
# llama.cpp when llama-cpp-python is importable): the bench commands one after another, nothing
# else running. Usage: benchmarks/issue13.sh [OUT_DIR]   (default: bench-out/)
# About 25 minutes on 2 cores. The online comparison against llama-server and
# `bench engine --llama-batched-bench` need llama.cpp's own tools (../shared/scripts/build-llama-cpp.sh)
# and are run apart: see benchmarks/online/README.md.
set -u
cd "$(dirname "$0")/.."
OUT=${1:-bench-out}
mkdir -p "$OUT"
B=${PAGEDATTN:-.venv/bin/pagedattn}
{ date; uptime; } > "$OUT/meta.txt"
$B bench generate --json "$OUT/generate.json" > "$OUT/generate.txt" 2>&1
$B bench generate --activations int8 --no-startup --json "$OUT/generate_int8.json" \
  > "$OUT/generate_int8.txt" 2>&1
$B bench kernels > "$OUT/kernels.txt" 2>&1
$B bench engine --json "$OUT/engine.json" > "$OUT/engine.txt" 2>&1
{ date; uptime; } >> "$OUT/meta.txt"
echo "figures in $OUT/"
