"""llama.cpp (the ``llama_cpp`` package, llama-cpp-python) as a peer in the same bench run:
same GGUF, same prompt ids, same thread count, greedy, each side in its own process.

Only measured when ``llama_cpp`` is importable (:func:`available`); the CLI prints "not
measured" otherwise, never stored numbers. Greedy tokens are the argmax of the logits
llama.cpp returns for the last evaluated token (``Llama.eval``, then
``llama_get_logits_ith(ctx, -1)``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Progress = Callable[[str, int, int], None]


def available() -> bool:
    """True when ``llama_cpp`` can be imported and finds its shared library (without importing
    it): in ``$LLAMA_CPP_LIB_PATH`` when set, as for a package installed with
    ``-DLLAMA_BUILD=OFF`` over a separate llama.cpp build, else in the package's ``lib``."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return False
    folder = Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(spec.origin).parent / "lib")
    return any((folder / f"libllama{ext}").is_file() for ext in (".so", ".dylib", ".dll"))


KV_SIZE = re.compile(r"llama_kv_cache: size =\s*([0-9.]+) MiB")


def _load(args: dict[str, Any], n_ctx: int) -> tuple[Any, float | None]:
    """The ``Llama`` and the KV cache size llama.cpp reports while loading (MiB; None when its
    log has no ``llama_kv_cache: size = ... MiB`` line). The log goes to the C stderr, so file
    descriptor 2 is redirected into a temporary file for the load."""
    from llama_cpp import Llama

    threads = int(args["threads"])
    with tempfile.TemporaryFile() as log:
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            # n_batch = n_ctx: a prompt is one llama_decode call (llama.cpp computes it in
            # micro-batches of n_ubatch = 512), as llama-batched-bench and llama-server do.
            llm = Llama(
                model_path=str(args["model_path"]),
                n_ctx=n_ctx,
                n_batch=n_ctx,
                n_ubatch=512,
                n_threads=threads,
                n_threads_batch=threads,
                verbose=True,
            )
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        found = KV_SIZE.search(log.read().decode("utf-8", "replace"))
    return llm, None if found is None else float(found.group(1))


def _last_logits(llm: Any) -> Any:
    """(n_vocab,) float32 logits of the last evaluated token. llama-cpp-python 0.3.x fills
    ``Llama.scores`` only with ``logits_all=True`` (its argmax was always 0 without it), so
    they are read from llama.cpp's own ``llama_get_logits_ith(ctx, -1)``."""
    import llama_cpp
    import numpy as np

    pointer = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(pointer, shape=(llm.n_vocab(),))


def _greedy(
    llm: Any, prompt: Sequence[int], new_tokens: int, tokens: list[int] | None = None
) -> tuple[float, float, int]:
    """Evaluate ``prompt`` then decode ``new_tokens`` greedily on a fresh context (appending
    them to ``tokens`` when given).

    Returns:
        (prefill seconds, seconds from the first to the last generated token, tokens made).
    """
    import numpy as np

    llm.reset()
    start = time.perf_counter()
    llm.eval(list(prompt))
    token = int(np.argmax(_last_logits(llm)))
    first = time.perf_counter()
    made = 1
    out = [token]
    while made < new_tokens:
        llm.eval([token])
        token = int(np.argmax(_last_logits(llm)))
        out.append(token)
        made += 1
    if tokens is not None:
        tokens.extend(out)
    return first - start, time.perf_counter() - first, made


def _first_logprobs(llm: Any, prompt: Sequence[int]) -> dict[str, float]:
    """Top-20 log-probabilities at the first generated position (token id as text)."""
    import numpy as np

    llm.reset()
    llm.eval(list(prompt))
    logits = np.asarray(_last_logits(llm), np.float64)
    logprobs = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    top = np.argsort(-logprobs)[:20]
    return {str(int(t)): float(logprobs[t]) for t in top}


def measure_generate(args: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Single stream: median prefill of ``repeats`` prompt evaluations, then one greedy decode.

    Args (JSON): ``model_path`` (a .gguf), ``prompt_ids``, ``output_len``, ``repeats``,
        ``threads``.
    """
    prompt, output_len, repeats = list(args["prompt_ids"]), int(args["output_len"]), args["repeats"]
    llm, kv_cache_mib = _load(args, len(prompt) + output_len + 8)
    total = repeats + 2
    _greedy(llm, prompt[:32], 3)
    progress("llama.cpp warm-up", 1, total)
    times = []
    for i in range(repeats):
        times.append(_greedy(llm, prompt, 1)[0])
        progress("llama.cpp prefill", i + 2, total)
    greedy_ids: list[int] = []
    _, decode_s, made = _greedy(llm, prompt, output_len, greedy_ids)
    progress("llama.cpp decode", total, total)
    prefill_s = statistics.median(times)
    return {
        "prefill_tok_s": len(prompt) / prefill_s,
        "decode_tok_s": (made - 1) / decode_s,
        "prefill_s": prefill_s,
        "generated": made,
        "kv_cache_mib": kv_cache_mib,
        "greedy_ids": greedy_ids,
        "first_logprobs": _first_logprobs(llm, prompt),
    }


def measure_engine(args: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """The engine bench's requests one after another (llama-cpp-python's ``Llama`` runs one
    sequence at a time; llama.cpp's own batched runs need ``llama-batched-bench``).

    Args (JSON): ``model_path``, ``prompts``, ``output_len``, ``threads``.
    """
    prompts, output_len = args["prompts"], int(args["output_len"])
    llm, _ = _load(args, max(len(p) for p in prompts) + output_len + 8)
    _greedy(llm, prompts[0][:20], 2)
    start = time.perf_counter()
    generated = 0
    for i, p in enumerate(prompts):
        generated += _greedy(llm, p, output_len)[2]
        progress("llama.cpp (sequential)", i + 1, len(prompts))
    elapsed = time.perf_counter() - start
    return {
        "main": {
            "elapsed_s": elapsed,
            "generated_tok_s": generated / elapsed,
            "requests_s": len(prompts) / elapsed,
            "generated": generated,
        }
    }


def measure_batched(
    binary: str, model_path: str, prompt_len: int, output_len: int, batch: int, threads: int
) -> dict[str, Any]:
    """llama.cpp's own batched decoding: ``llama-batched-bench`` (built by
    ``../shared/scripts/build-llama-cpp.sh``) with ``batch`` sequences of ``prompt_len`` prompt
    tokens and ``output_len`` generated tokens each, on ``threads`` threads.

    Returns:
        ``{"main": {"generated_tok_s", "requests_s", "elapsed_s", "generated", "prefill_tok_s",
        "decode_tok_s"}}``: end to end (prefill included) as in ``bench engine``'s rows.

    Raises:
        FileNotFoundError: ``binary`` does not exist. RuntimeError: it failed or printed no
            result line.
    """
    import json
    import os
    import subprocess
    from pathlib import Path

    exe = Path(binary)
    if not exe.is_file():
        raise FileNotFoundError(f"--llama-batched-bench: no such file {binary}")
    n_ctx = batch * (prompt_len + output_len) + 64
    cmd = [str(exe), "-m", model_path, "-npp", str(prompt_len), "-ntg", str(output_len),
           "-npl", str(batch), "-t", str(threads), "-c", str(n_ctx),
           "--output-format", "jsonl"]  # fmt: skip
    lib = str(exe.parent)
    env = dict(os.environ, LD_LIBRARY_PATH=f"{lib}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    rows = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{") and '"pl"' in x]
    if proc.returncode != 0 or not rows:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"llama-batched-bench failed (exit {proc.returncode}): {tail}")
    r = rows[-1]
    generated = int(r["pl"]) * int(r["tg"])
    return {
        "main": {
            "generated_tok_s": generated / float(r["t"]),
            "requests_s": int(r["pl"]) / float(r["t"]),
            "elapsed_s": float(r["t"]),
            "generated": generated,
            "prefill_tok_s": float(r["speed_pp"]),
            "decode_tok_s": float(r["speed_tg"]),
        }
    }
