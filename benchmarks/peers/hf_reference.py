"""The reference side of the benchmarks: Hugging Face transformers on the same model file.

transformers dequantizes a GGUF to float32 torch tensors (``from_pretrained(dir,
gguf_file=name)``), the values our projections decode from the same GGUF blocks row by row
(never expanded to a float32 copy; logits within 1e-3). Prompts are our token ids
(the tokenizers agree id for id, see tests/model/test_tokenizer.py). Nothing is fetched:
``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Progress = Callable[[str, int, int], None]


def load_hf_model(model_path: str | Path, threads: int) -> Any:
    """Load a float32 ``AutoModelForCausalLM`` from a .gguf file or a Hugging Face folder.

    Args:
        model_path: a .gguf file (loaded with ``gguf_file=``) or a folder with config.json.
        threads: ``torch.set_num_threads``.

    Raises:
        ImportError: torch/transformers missing. OSError/ValueError: from transformers.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    import transformers

    torch.set_num_threads(threads)
    path = Path(model_path)
    kwargs: dict[str, Any] = {"dtype": torch.float32}
    if path.suffix == ".gguf":
        kwargs["gguf_file"] = path.name
        path = path.parent
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    model.eval()
    return model


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def hf_single_stream(
    model: Any,
    prompt_ids: Sequence[int],
    output_len: int,
    repeats: int,
    progress: Progress,
) -> dict[str, Any]:
    """Prefill and decode speed of HF ``generate`` for one sequence (greedy, EOS ignored).

    Method: prefill = median time of one ``model(prompt)`` forward with ``use_cache=True``
    (after one warm-up forward); decode = ``(output_len - 1) / (t(generate output_len) -
    t(generate 1))``: the extra tokens' share of a full greedy ``generate`` with
    ``min_new_tokens = max_new_tokens``, the prefill and generate's set-up cancelling out.

    Args:
        model: an HF causal LM. prompt_ids: (prompt_len,) ids. output_len: >= 2 new tokens.
        repeats: timed forwards for the prefill median. progress: (phase, done, total).

    Returns:
        ``{"prefill_tok_s", "decode_tok_s", "prefill_s", "generate_s", "greedy_ids",
        "first_logprobs"}``: the greedy tokens of the timed ``generate``, and the top-20
        log-probabilities (token id as text -> float) at the first generated position.
    """
    import torch

    if output_len < 2:
        raise ValueError(f"output_len: expected >= 2 for a decode rate, got {output_len}")
    ids = torch.tensor([list(prompt_ids)])
    mask = torch.ones_like(ids)

    def gen(n: int) -> Any:
        return model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
        )

    with torch.no_grad():
        model(ids[:, :16], use_cache=True)  # warm-up
        total = repeats + 2
        times = []
        for i in range(repeats):
            times.append(_timed(lambda: model(ids, use_cache=True)))
            progress("HF prefill", i + 1, total)
        t1 = _timed(lambda: gen(1))
        progress("HF generate", repeats + 1, total)
        generated: list[Any] = []
        tn = _timed(lambda: generated.append(gen(output_len)))
        progress("HF generate", total, total)
        logits = model(ids, use_cache=False).logits[0, -1].double()  # not timed
        first = torch.log_softmax(logits, dim=-1).topk(20)
    prefill_s = statistics.median(times)
    return {
        "prefill_tok_s": len(prompt_ids) / prefill_s,
        "decode_tok_s": (output_len - 1) / max(tn - t1, 1e-9),
        "prefill_s": prefill_s,
        "generate_s": tn,
        "greedy_ids": [int(t) for t in generated[0][0, len(prompt_ids) :]],
        "first_logprobs": {
            str(int(t)): float(v) for t, v in zip(first.indices, first.values, strict=True)
        },
    }


def hf_batch_generate(
    model: Any,
    prompts: Sequence[Sequence[int]],
    output_len: int,
    batch_size: int,
    pad_token_id: int,
    progress: Progress,
) -> dict[str, float]:
    """Offline throughput of HF ``generate`` over batches of left-padded prompts (greedy, EOS
    ignored via ``min_new_tokens``), prompts in the given order.

    Args:
        prompts: token-id lists. output_len: new tokens per prompt. batch_size: prompts per
            ``generate`` call. pad_token_id: the id padding uses (masked out).

    Returns:
        ``{"elapsed_s", "generated_tok_s", "requests_s"}``.
    """
    import torch

    done, elapsed = 0, 0.0
    with torch.no_grad():
        model(torch.tensor([list(prompts[0][:16])]), use_cache=True)  # warm-up
        for start in range(0, len(prompts), batch_size):
            batch = prompts[start : start + batch_size]
            width = max(len(p) for p in batch)
            ids = torch.tensor([[pad_token_id] * (width - len(p)) + list(p) for p in batch])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])

            def gen(ids: Any = ids, mask: Any = mask) -> None:
                model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=output_len,
                    min_new_tokens=output_len,
                    do_sample=False,
                    pad_token_id=pad_token_id,
                )

            elapsed += _timed(gen)
            done += len(batch)
            progress("HF generate (batches)", done, len(prompts))
    return {
        "elapsed_s": elapsed,
        "generated_tok_s": len(prompts) * output_len / elapsed,
        "requests_s": len(prompts) / elapsed,
    }


def measure_generate(args: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Worker entry point: HF transformers on one stream (method: :func:`hf_single_stream`).

    Args (JSON): ``model_path`` (a .gguf or HF folder), ``prompt_ids``, ``output_len``,
        ``repeats``, ``threads``.
    """
    model = load_hf_model(args["model_path"], int(args["threads"]))
    return hf_single_stream(
        model, args["prompt_ids"], int(args["output_len"]), int(args["repeats"]), progress
    )


def measure_engine(args: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Worker entry point: HF ``generate`` over batches of ``batch_size`` left-padded prompts.

    Args (JSON): ``model_path``, ``prompts``, ``output_len``, ``batch_size``, ``pad_token_id``,
        ``threads``.
    """
    model = load_hf_model(args["model_path"], int(args["threads"]))
    main = hf_batch_generate(
        model,
        args["prompts"],
        int(args["output_len"]),
        int(args["batch_size"]),
        int(args["pad_token_id"]),
        progress,
    )
    return {"main": main}
