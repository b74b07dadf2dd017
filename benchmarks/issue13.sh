#!/usr/bin/env bash
# Issue 13's figures in one go, every peer in the same run (HF transformers from the test extra,
# llama.cpp when llama-cpp-python is importable): the bench commands one after another, nothing
# else running. Usage: benchmarks/issue13.sh [OUT_DIR]   (default: bench-out/)
# About 15 minutes on 2 cores. With llama.cpp's own tools built (../shared/scripts/build-llama-cpp.sh,
# never in CI), LLAMA_BATCHED_BENCH=.../llama-batched-bench adds llama.cpp's batched decoding to
# `bench engine`, and LLAMA_SERVER=.../llama-server runs the online comparison
# (benchmarks/online/compare.py) last, default and with int8 activations and a float16 KV
# cache, about 8 minutes more.
set -u
cd "$(dirname "$0")/.."
OUT=${1:-bench-out}
mkdir -p "$OUT"
B=${PAGEDATTN:-.venv/bin/pagedattn}
{ date; uptime; } > "$OUT/meta.txt"
$B bench generate --json "$OUT/generate.json" > "$OUT/generate.txt" 2>&1
# llama.cpp's own arithmetic: int8 activations and a float16 KV cache (explicit, not exact)
$B bench generate --activations int8 --kv-cache-dtype float16 --no-startup \
  --json "$OUT/generate_int8.json" > "$OUT/generate_int8.txt" 2>&1
$B bench kernels --kv-cache-dtype float32 --kv-cache-dtype float16 > "$OUT/kernels.txt" 2>&1
$B bench engine --json "$OUT/engine.json" > "$OUT/engine.txt" 2>&1
if [ -n "${LLAMA_SERVER:-}" ]; then
  ${PYTHON:-.venv/bin/python} benchmarks/online/compare.py --llama-server "$LLAMA_SERVER" \
    --concurrency 1,8,32 --num-requests 32 --max-tokens 64 --threads 2 > "$OUT/online.txt" 2>&1
  ${PYTHON:-.venv/bin/python} benchmarks/online/compare.py --llama-server "$LLAMA_SERVER" \
    --concurrency 1,8,32 --num-requests 32 --max-tokens 64 --threads 2 \
    --serve-args "--activations int8 --kv-cache-dtype float16" > "$OUT/online_int8.txt" 2>&1
fi
{ date; uptime; } >> "$OUT/meta.txt"
echo "figures in $OUT/"
