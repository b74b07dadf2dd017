#!/usr/bin/env bash
# The GPU check: the backend tests on torch/$DEVICE, then prefill / decode /
# batch-32 speed of our torch backend vs HF transformers on the same device, with a random
# model of SmolLM2-135M's shape (no GGUF, nothing fetched). Uses whatever torch is installed.
#
#   scripts/gpu_check.sh            # on a CUDA machine (DEVICE=cuda), about 2-4 minutes
#   DEVICE=cpu scripts/gpu_check.sh --quick   # the same path on the CPU, short sizes
#
# Env: DEVICE (cuda|cpu, default cuda), PYTHON (default: python3), DTYPE (float32 default;
# float16 / bfloat16 for the benchmark), OUT (folder for gpu_check.json, default: .).
# Needs the project's test dependencies (numpy, numba, pytest, hypothesis, gguf, ...); HF
# transformers is optional (its column says "not measured" without it).
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE="${DEVICE:-cuda}"
PY="${PYTHON:-python3}"
DTYPE="${DTYPE:-float32}"
OUT="${OUT:-.}"
QUICK=()
if [[ "${1:-}" == "--quick" ]]; then QUICK=(--quick); fi
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 NUMBA_NUM_THREADS="${NUMBA_NUM_THREADS:-2}"
"$PY" - "$DEVICE" <<'PYEOF'
import sys, torch
device = sys.argv[1]
print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}", flush=True)
if device == "cuda" and not torch.cuda.is_available():
    sys.exit("error: DEVICE=cuda but torch sees no GPU; use DEVICE=cpu")
if device == "cuda":
    print(f"device: {torch.cuda.get_device_name()}", flush=True)
PYEOF
if [[ "$DEVICE" == "cuda" ]]; then
  export PAGEDATTN_TEST_DEVICES=cuda
  SELECT="cuda"
else
  SELECT="torch"
fi
echo "== backend tests on $DEVICE (engine, kernels, KVStream; not the SmolLM2 ones)"
timeout 240 "$PY" -m pytest -q -p no:cacheprovider tests/backends \
  tests/kernels/test_paged_property.py tests/stream/test_kv_stream_backends.py \
  -m "not model" -k "$SELECT"
echo "== benchmark: ours (torch/$DEVICE) vs HF transformers"
timeout 240 "$PY" benchmarks/compare.py gpu --device "$DEVICE" --dtype "$DTYPE" "${QUICK[@]}" \
  --json "$OUT/gpu_check.json"
