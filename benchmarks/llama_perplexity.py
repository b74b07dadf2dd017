"""Perplexity of a model (the embedded SmolLM2 by default) by llama.cpp's own
``llama-perplexity`` and by ``pagedattn eval ppl --method chunks`` in the matching mode, side by
side per KV dtype.

    .venv/bin/python benchmarks/llama_perplexity.py --chunks 8
    .venv/bin/python benchmarks/llama_perplexity.py --llama-perplexity PATH --kv f16
    .venv/bin/python benchmarks/llama_perplexity.py --model qwen2.5-coder-0.5b --activations float32

Both sides read the same GGUF and the same text (the novel shipped in the package) and use
llama-perplexity's method: non-overlapping chunks of ``--ctx`` tokens (512), each run from an
empty KV cache and scored on its second half, the first ``--chunks`` chunks of the text (the
vocabulary adds no BOS, so no chunk starts with one). llama.cpp runs with ``-ctk X -ctv X``
(``f16``, ``q8_0``) and flash attention on (q8_0 V needs it; both KV types get it); our side
with ``--activations int8`` (llama.cpp's arithmetic: inputs of the 4-bit matmuls quantized per
32 values) and the KV dtype that matches: f16 -> float16, q8_0 -> int8 (when this build's KV
pool has it). Prints both perplexities and their ratio (ours over llama.cpp's). When the
binary is absent (``--llama-perplexity``, default ``$LLAMA_PERPLEXITY`` or the
``llama-perplexity`` on ``PATH``), llama.cpp's side is "not measured".
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
from pathlib import Path

from pagedattn.bench.corpus import corpus_token_ids, default_corpus_file
from pagedattn.eval.chunks import run_chunked_perplexity
from pagedattn.eval.kv_pools import KV_CACHE_DTYPES
from pagedattn.model.catalogue import resolve_model
from pagedattn.model.decoder import DecoderModel
from pagedattn.model.loader import load_model

DEFAULT_BINARY = shutil.which("llama-perplexity") or "llama-perplexity"
OURS = {"f16": "float16", "q8_0": "int8", "f32": "float32"}
FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")


def llama_perplexity(
    binary: Path, model: Path, text: Path, ctx: int, chunks: int, kv: str, threads: int
) -> tuple[float, float]:
    """llama-perplexity's final estimate and its +/- for one KV type.

    Raises:
        RuntimeError: it failed or printed no final estimate (the last stderr line says why).
    """
    cmd = [str(binary), "-m", str(model), "-f", str(text), "-c", str(ctx), "-b", str(ctx),
           "--chunks", str(chunks), "-ctk", kv, "-ctv", kv, "-fa", "on",
           "-t", str(threads)]  # fmt: skip
    lib = str(binary.parent)
    env = dict(os.environ, LD_LIBRARY_PATH=f"{lib}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    found = FINAL.search(proc.stdout + proc.stderr)
    if proc.returncode != 0 or found is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"llama-perplexity -ctk {kv} failed (exit {proc.returncode}): {tail}")
    return float(found.group(1)), float(found.group(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--llama-perplexity",
        type=Path,
        default=Path(os.environ.get("LLAMA_PERPLEXITY", DEFAULT_BINARY)),
    )
    parser.add_argument("--model", default=None, help="a GGUF file or packaged model name")
    parser.add_argument("--ctx", type=int, default=512, help="llama-perplexity's -c")
    parser.add_argument("--chunks", type=int, default=8, help="chunks scored (-c tokens each)")
    parser.add_argument("--kv", default="f16,q8_0", help="llama.cpp KV types: f16, q8_0, f32")
    parser.add_argument("--activations", default="int8", help="our side: int8 or float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--page-size", type=int, default=16)
    args = parser.parse_args()
    kvs = [k.strip() for k in args.kv.split(",") if k.strip()]
    unknown = [k for k in kvs if k not in OURS]
    if unknown:
        parser.error(f"--kv: expected some of {', '.join(OURS)}, got {unknown}")
    model, text = resolve_model(args.model), default_corpus_file()
    loaded = load_model(model)
    ids = corpus_token_ids(loaded.tokenizer, text, args.ctx * args.chunks)[: args.ctx * args.chunks]
    net = DecoderModel.from_loaded(loaded, args.activations)
    bos = loaded.tokenizer.bos_token_id if loaded.tokenizer.adds_bos else None
    have_binary = args.llama_perplexity.is_file()
    if not have_binary:
        print(
            f"llama.cpp: not measured ({args.llama_perplexity} not found; --llama-perplexity PATH)"
        )
    load = os.getloadavg()
    print(
        f"{model.name}, {text.name}, {args.chunks} chunks of {args.ctx} tokens (second halves "
        f"scored), our activations {args.activations}, load average {load[0]:.2f}"
    )
    print(f"{'KV':>6} {'llama.cpp':>16} {'pagedattn':>10} {'ratio':>7}")
    for kv in kvs:
        dtype = OURS[kv]
        ours: float | None = None
        if dtype in KV_CACHE_DTYPES:
            ours = run_chunked_perplexity(
                net, ids, chunk_tokens=args.ctx, page_size=args.page_size, kv_cache_dtype=dtype,
                bos_token_id=bos,
            ).perplexity  # fmt: skip
        theirs = None
        if have_binary:
            theirs = llama_perplexity(
                args.llama_perplexity, model, text, args.ctx, args.chunks, kv, args.threads
            )
        left = "not measured" if theirs is None else f"{theirs[0]:.4f} +/- {theirs[1]:.3f}"
        right = (
            f"{ours:.4f}" if ours is not None else f"not measured ({dtype} KV not in this build)"
        )
        if ours is not None and theirs is not None:
            print(f"{kv:>6} {left:>16} {right:>10} {ours / theirs[0]:>7.4f}")
        else:
            print(f"{kv:>6} {left:>16} {right:>10} {'-':>7}  not measured")


if __name__ == "__main__":
    main()
