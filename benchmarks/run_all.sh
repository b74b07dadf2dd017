#!/usr/bin/env bash
# Every benchmark figure of the README in one go, nothing else running: our side
# (pagedattn bench ...) and the same-run comparisons with each peer (benchmarks/compare.py: HF
# transformers from the test extra, llama.cpp when llama-cpp-python is importable).
# Usage: benchmarks/run_all.sh [OUT_DIR]   (default: bench-out/)
# About 20 minutes on 2 cores. With llama.cpp's own tools built (../shared/scripts/build-llama-cpp.sh,
# never in CI), LLAMA_BATCHED_BENCH=.../llama-batched-bench adds llama.cpp's batched decoding to
# `compare.py engine`, and LLAMA_SERVER=.../llama-server runs the online comparison
# (benchmarks/online/compare.py) last, default and with int8 activations and a float16 KV
# cache, about 8 minutes more, then the grounded workload with speculation against llama-server's
# n-gram speculative settings (3 minutes). GGUF_FILES="a.gguf b.gguf" adds one
# `compare.py generate --no-hf` per file (llama.cpp on the same file; 3 minutes each).
set -u
cd "$(dirname "$0")/.."
OUT=${1:-bench-out}
mkdir -p "$OUT"
B=${PAGEDATTN:-.venv/bin/pagedattn}
{ date; uptime; } > "$OUT/meta.txt"
PY=${PYTHON:-.venv/bin/python}
$B bench generate --json "$OUT/generate.json" > "$OUT/generate.txt" 2>&1
$PY benchmarks/compare.py generate --json "$OUT/compare_generate.json" \
  > "$OUT/compare_generate.txt" 2>&1
# llama.cpp's own arithmetic: int8 activations and a float16 KV cache (explicit, not exact)
$PY benchmarks/compare.py generate --activations int8 --kv-cache-dtype float16 \
  --json "$OUT/compare_generate_int8.json" > "$OUT/compare_generate_int8.txt" 2>&1
$B bench spec --rounds 2 > "$OUT/spec.txt" 2>&1
for f in ${GGUF_FILES:-}; do
  $PY benchmarks/compare.py generate --no-hf -m "$f" --json "$OUT/compare_generate_$(basename "$f").json" \
    > "$OUT/compare_generate_$(basename "$f").txt" 2>&1
done
$B bench kernels --kv-cache-dtype float32 --kv-cache-dtype float16 > "$OUT/kernels.txt" 2>&1
$B bench engine --json "$OUT/engine.json" > "$OUT/engine.txt" 2>&1
$PY benchmarks/compare.py engine --json "$OUT/compare_engine.json" \
  > "$OUT/compare_engine.txt" 2>&1
if [ -n "${LLAMA_SERVER:-}" ]; then
  $PY benchmarks/online/compare.py --llama-server "$LLAMA_SERVER" \
    --concurrency 1,8,32 --num-requests 32 --max-tokens 64 --threads 2 > "$OUT/online.txt" 2>&1
  $PY benchmarks/online/compare.py --llama-server "$LLAMA_SERVER" \
    --concurrency 1,8,32 --num-requests 32 --max-tokens 64 --threads 2 \
    --serve-args "--activations int8 --kv-cache-dtype float16" > "$OUT/online_int8.txt" 2>&1
  $PY benchmarks/online/compare.py --llama-server "$LLAMA_SERVER" --workload grounded \
    --concurrency 1 --num-requests 10 --max-tokens 128 --threads 2 \
    --peer-spec ngram-simple,ngram-map-k,ngram-mod,ngram-cache > "$OUT/online_spec.txt" 2>&1
fi
{ date; uptime; } >> "$OUT/meta.txt"
echo "figures in $OUT/"
