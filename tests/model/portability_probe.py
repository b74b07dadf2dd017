"""What the CPU-portability tests compare across the CPUs Numba compiles for.

``python -m tests.model.portability_probe OUT.npz [--smollm2] [--int8-cli]`` computes, on the
CPU named by ``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` (the host's without them), every output
below and saves them to ``OUT.npz`` (plain arrays, no pickle); the tests call :func:`collect` in
their own process for the host's values. Everything the exact float path computes is here: the block
matmuls of every kind and row count, the float matmuls, the row ops, paged attention over
float32 and float16 pools, a tiny Llama (float and Q4_0 / Q8_0 weights) decoded greedily
through the fused and the step-by-step decode, and, with ``--smollm2``, the embedded model.
With ``--int8-cli`` (for a CPU without AVX2), ``int8_output`` also holds what ``pagedattn
generate --activations int8`` printed on this CPU, and ``int8_exit_code`` its exit code (on a CPU
with AVX2 the int8 kernels' bits are checked per path by ``tests/model/test_int8_paths.py``).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize

from pagedattn.kernels import paged_attention_decode, paged_attention_prefill
from pagedattn.model.llama import LlamaModel
from pagedattn.model.loader import load_model
from pagedattn.model.quantized import dequantize_rows, from_gguf_blocks, qmatmul
from pagedattn.model.row_ops import rms_norm, silu_mul
from tests.kernels.helpers import randn, scatter_sequences
from tests.model.paging import PagedSequences
from tests.model.random_blocks import NEW_TYPES, random_blocks
from tests.model.tiny import random_weights, tiny_config, write_tiny_gguf

TINY_PROMPT = [5, 9, 14, 20, 3, 7, 11, 40, 41, 42, 100, 7, 9, 3, 200, 17, 18]
TINY_STEPS = 12
SMOLLM2_PROMPT = "The capital of France is Paris. The capital of Italy is"
SMOLLM2_STEPS = 8


def _matmuls(out: dict[str, np.ndarray]) -> None:
    rng = np.random.default_rng(0)
    for qtype in (Q.Q4_0, Q.Q4_1, Q.Q8_0):
        w = rng.standard_normal((37, 32 * 5)).astype(np.float32)
        block = from_gguf_blocks(quantize(w, qtype), qtype.name, (37, 160))
        for rows in (1, 2, 7):  # registers (decode), scratch (prefill), with tails
            x = rng.standard_normal((rows, 160)).astype(np.float32)
            out[f"qmatmul_{qtype.name}_{rows}"] = qmatmul(x, block, block)
        out[f"dequantize_{qtype.name}"] = dequantize_rows(block, np.arange(37))
    for qtype in NEW_TYPES:  # Q5_0, Q5_1 and the K-quants: random blocks, two super-blocks
        for n in (37, 40):  # rows one after another, and in groups of four
            raw = random_blocks(qtype, (n, 512), rng)
            block = from_gguf_blocks(raw, qtype.name, (n, 512))
            for rows in (1, 7):
                x = rng.standard_normal((rows, 512)).astype(np.float32)
                out[f"qmatmul_{qtype.name}_{n}_{rows}"] = qmatmul(x, block)
            out[f"dequantize_{qtype.name}_{n}"] = dequantize_rows(block, np.arange(n))
    for width in (160, 150):  # a multiple of 16 lanes, and not
        w = rng.standard_normal((21, width)).astype(np.float32)
        x = rng.standard_normal((5, width)).astype(np.float32)
        out[f"matmul_float_{width}"] = qmatmul(x, w)
    x = rng.standard_normal((5, 150)).astype(np.float32)
    out["rms_norm"] = rms_norm(x, rng.standard_normal(150).astype(np.float32), 1e-5)
    out["silu_mul"] = silu_mul(rng.standard_normal((5, 2 * 150)).astype(np.float32) * 4)


def _attention(out: dict[str, np.ndarray]) -> None:
    rng = np.random.default_rng(7)
    lens = [1, 70, 300]
    q_lens = [1, 30, 7]
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    for dtype in (np.float32, np.float16):
        ks = [randn(rng, n, 2, 64) * 2 for n in lens]
        vs = [randn(rng, n, 2, 64) for n in lens]
        kc, vc, tables = scatter_sequences(ks, vs, 16, rng, fill=np.nan, dtype=dtype)
        ctx = np.array(lens, np.int32)
        for window, sinks in ((None, 0), (50, 4)):
            opts = {"sliding_window": window, "num_sink_tokens": sinks}
            name = f"{np.dtype(dtype).name}_{window}"
            q = randn(rng, len(lens), 6, 64)
            out[f"decode_{name}"] = paged_attention_decode(q, kc, vc, tables, ctx, **opts)
            qp = randn(rng, int(qsl[-1]), 6, 64)
            out[f"prefill_{name}"] = paged_attention_prefill(qp, kc, vc, tables, qsl, ctx, **opts)


def _greedy_logits(
    model: LlamaModel, prompt: list[int], steps: int, kv_dtype: type[np.generic]
) -> np.ndarray:
    """(steps, vocab) logits of greedy decoding: the prompt's last row, then each step's."""
    state = PagedSequences(model, (len(prompt) + steps) // 16 + 2, 16)
    state.kv = state.kv.astype(kv_dtype)
    seq = state.new_sequence()
    rows = [state.step({seq: prompt})[0]]
    while len(rows) < steps:
        rows.append(state.step({seq: [int(np.argmax(rows[-1]))]})[0])
    return np.stack(rows)


def _tiny_models(out: dict[str, np.ndarray], folder: Path) -> None:
    config = tiny_config()
    weights = random_weights(config)
    for qtype in (Q.F32, Q.Q4_0, Q.Q8_0):
        loaded = load_model(
            write_tiny_gguf(folder / f"{qtype.name}.gguf", config, weights, qtype=qtype)
        )
        for fused in (True, False):
            model = LlamaModel(loaded.config, loaded.weights, loaded.quantized, fused_decode=fused)
            for kv_dtype in (np.float32, np.float16):
                key = f"tiny_{qtype.name}_{'fused' if fused else 'steps'}_{np.dtype(kv_dtype).name}"
                out[key] = _greedy_logits(model, TINY_PROMPT, TINY_STEPS, kv_dtype)


def _smollm2(out: dict[str, np.ndarray]) -> None:
    loaded = load_model(None)
    model = LlamaModel.from_loaded(loaded)
    prompt = loaded.tokenizer.encode(SMOLLM2_PROMPT)
    for kv_dtype in (np.float32, np.float16):
        out[f"smollm2_{np.dtype(kv_dtype).name}"] = _greedy_logits(
            model, prompt, SMOLLM2_STEPS, kv_dtype
        )


def int8_cli(folder: Path) -> tuple[int, str]:
    """Exit code and output of ``pagedattn generate --activations int8`` on a tiny Q4_1 model."""
    from typer.testing import CliRunner

    import pagedattn.cli.generate  # noqa: F401  (registers the command)
    from pagedattn.cli.app import app

    config = tiny_config()
    path = write_tiny_gguf(folder / "q4_1.gguf", config, random_weights(config), qtype=Q.Q4_1)
    args = ["generate", "hello", "--model", str(path), "--max-tokens", "2"]
    done = CliRunner().invoke(app, [*args, "--activations", "int8"])
    return done.exit_code, done.output


def collect(smollm2: bool) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    _matmuls(out)
    _attention(out)
    with tempfile.TemporaryDirectory() as folder:
        _tiny_models(out, Path(folder))
    if smollm2:
        _smollm2(out)
    return out


def main() -> None:
    target = Path(sys.argv[1])
    out = collect("--smollm2" in sys.argv)
    if "--int8-cli" in sys.argv:
        with tempfile.TemporaryDirectory() as folder:
            code, text = int8_cli(Path(folder))
        out["int8_exit_code"] = np.array(code)
        out["int8_output"] = np.frombuffer(text.encode(), np.uint8)
    np.savez(target, **out)


if __name__ == "__main__":
    main()
