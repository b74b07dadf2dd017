"""Where a single-stream decode step's time goes, interleaved with llama.cpp in one process.

    .venv/bin/python benchmarks/decode_breakdown.py --context 512 [--kv-cache-dtype float16]
        [--activations int8] [--rounds 25] [--model PATH.gguf]

Each round times, one after the other (so every figure sees the same machine phase):

* ``step``: one engine step of a greedy request whose context is ``--context`` tokens (the
  fused decode path, sampling and detokenization included);
* ``matmuls``: the step's 211 projections alone (every layer's q|k|v, o, gate|up, down on one
  row, then the LM head), on the model's own GGUF blocks;
* ``attention``: decode attention alone, 30 calls over 30 distinct random pools of that context
  (each layer's KV in its own memory, as in the step: streamed from DRAM, not from cache);
* ``llama.cpp``: one ``llama_eval`` of one token at the same context, same GGUF and threads
  (when ``llama_cpp`` is importable).

Medians over the rounds, in ms; ``other`` is the step minus matmuls and attention.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

import numba
import numpy as np

from pagedattn.bench.corpus import corpus_token_ids
from pagedattn.bench.kernels import interleaved_median_ms
from pagedattn.engine.llm import LLM
from pagedattn.kernels.kv_dtype import kernel_cache
from pagedattn.kernels.paged import split_counts
from pagedattn.kernels.paged_decode_numba import decode_attention
from pagedattn.model.block_dot import qmatmul_blocks
from pagedattn.model.quantized import qmatmul
from pagedattn.model.registry import embedded_model_path
from pagedattn.sampling_params import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--kv-cache-dtype", default="float32", choices=("float32", "float16"))
    parser.add_argument("--activations", default="float32", choices=("float32", "int8"))
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", "-m", default=None, help="GGUF file (default: SmolLM2)")
    args = parser.parse_args()
    numba.set_num_threads(args.threads)
    ctx = args.context
    llm = LLM(
        args.model,
        page_size=16,
        num_pages=math.ceil((ctx + 4 * args.rounds + 16) / 16) + 8,
        kv_cache_dtype=args.kv_cache_dtype,
        activations=args.activations,
        enable_prefix_caching=False,
        speculative="none",  # one token per step, as llama_eval's
    )
    engine = llm.engine
    model = engine.runner.model
    prompt = corpus_token_ids(engine.tokenizer, None, ctx)[:ctx]
    params = SamplingParams(temperature=0, max_tokens=4 * args.rounds + 8, ignore_eos=True)
    engine.add_request(prompt, params)
    for _ in range(3):  # the prefill, then two decode steps
        engine.step()

    int8 = args.activations == "int8"  # every block matrix on the int8 path, as the fused step
    layers = [layer.fused_args() for layer in model.layers]
    hidden, inter = model.config.hidden_size, model.layers[0].gate_up[0].shape[0]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, hidden)).astype(np.float32)
    act = rng.standard_normal((1, inter)).astype(np.float32)
    qkv_width = model.layers[0].qkv[0].shape[0] + 2 * model.layers[0].qkv[1].shape[0]
    qkv = np.empty((1, qkv_width), np.float32)
    o_out = np.empty((1, hidden), np.float32)
    gate_up = np.empty((1, 2 * inter), np.float32)

    def _project(x, b0, b1, b2, kinds, kind_set, num_parts, out):  # type: ignore[no-untyped-def]
        """What decode_layer's fused step runs for one projection (its _project is Numba's):
        one launch of its parts, int8 or exact."""
        if int8:
            from pagedattn.model.block_dot_int8 import project_int8  # compiled for int8 only

            project_int8(x, b0, b1, b2, kinds, num_parts, out)
        else:
            qmatmul_blocks(x, b0, b1, b2, kinds, kind_set, num_parts, out)

    def matmuls() -> None:
        for w in layers:
            assert w is not None
            _, _, bq, bk, bv, qkv_kinds, bo, o_kind, bg, bu, gu_kinds, bd, d_kind, ks = w
            _project(x, bq, bk, bv, qkv_kinds, ks, 3, qkv)
            _project(x, bo, bo, bo, (o_kind, o_kind, o_kind), ks, 1, o_out)
            _project(x, bg, bu, bu, (gu_kinds[0], gu_kinds[1], gu_kinds[1]), ks, 2, gate_up)
            _project(act, bd, bd, bd, (d_kind, d_kind, d_kind), ks, 1, o_out)
        qmatmul(x, model.lm_head, activations=args.activations)

    c = model.config
    pages = math.ceil(ctx / 16)
    shape = (pages, c.num_kv_heads, 16, c.head_dim)
    pools = [
        tuple(
            kernel_cache((rng.random(shape, dtype=np.float32) - 0.5).astype(args.kv_cache_dtype))
            for _ in range(2)
        )
        for _ in range(c.num_layers)
    ]
    tables = rng.permutation(pages).astype(np.int32)[None, :]
    lens = np.array([ctx], np.int32)
    q = rng.standard_normal((1, c.num_heads, c.head_dim), dtype=np.float32)
    splits, num_splits = split_counts(lens, None)
    scale = np.float32(1 / math.sqrt(c.head_dim))

    def attention() -> None:
        for k, v in pools:
            decode_attention(q, q, k, v, tables, lens, splits, scale, 0, 0, num_splits)

    timers: dict[str, Callable[[], object]] = {
        "step": engine.step,
        "matmuls": matmuls,
        "attention": attention,
    }
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
    from benchmarks.peers import llamacpp

    if llamacpp.available():
        peer, _ = llamacpp._load(
            {"threads": args.threads, "model_path": args.model or embedded_model_path()},
            ctx + 4 * args.rounds + 64,
        )
        peer.reset()
        peer.eval(list(prompt))
        token = [int(np.argmax(llamacpp._last_logits(peer)))]

        def llama_cpp() -> None:
            peer.eval([token[0]])
            token[0] = int(np.argmax(llamacpp._last_logits(peer)))

        timers["llama.cpp"] = llama_cpp
    ms = interleaved_median_ms(timers, args.rounds)
    ms["other"] = ms["step"] - ms["matmuls"] - ms["attention"]
    print(
        f"context {ctx}, KV {args.kv_cache_dtype}, activations {args.activations}, "
        f"{args.threads} threads, median of {args.rounds} interleaved rounds (ms):"
    )
    for name in ("step", "matmuls", "attention", "other", "llama.cpp"):
        if name in ms:
            print(f"  {name:10s} {ms[name]:7.2f}")
    if "llama.cpp" in ms:
        print(f"  ours / llama.cpp tok/s: {ms['llama.cpp'] / ms['step']:.2f}x")


if __name__ == "__main__":
    main()
