"""Our engine on the torch backend vs HF transformers on the same device, with a random model
of SmolLM2-135M's shape (no GGUF needed, nothing fetched): ``python benchmarks/compare.py gpu``
or ``python -m benchmarks.peers.gpu`` from the repository root.

Figures: prefill tok/s of one prompt, decode tok/s of one greedy stream, and the generated
tok/s of a batch of requests (ours: continuous batching, all queued at once; HF: one
``generate`` call on the left-padded batch). Both sides hold the same weights in the same
dtype; timings on CUDA end with a synchronisation (ours: the logits copy to the host).
``scripts/gpu_check.sh`` runs it after the backend tests.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from pagedattn.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig

SMOLLM2_SHAPE: dict[str, Any] = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_layers": 30,
    "num_heads": 9,
    "num_kv_heads": 3,
    "head_dim": 64,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
FULL = {"prompt_len": 512, "output_len": 128, "batch": 32, "batch_prompt": 256, "layers": 30}
QUICK = {"prompt_len": 64, "output_len": 16, "batch": 4, "batch_prompt": 32, "layers": 4}


def random_weights(config: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """float32 weights by HF name: norms ``1 + 0.1 N(0, 1)``, linears ``N(0, 1) / sqrt(in)``."""
    from pagedattn.model.weights import expected_weight_shapes

    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_weight_shapes(config).items():
        w = rng.standard_normal(shape, dtype=np.float32)
        out[name] = 1.0 + 0.1 * w if len(shape) == 1 else w / np.float32(np.sqrt(shape[1]))
    return out


def _sync(torch: Any, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure_ours(
    model: Any, device: str, sizes: dict[str, int], prompts: list[list[int]]
) -> dict[str, float]:
    """Prefill / decode / batch figures of our engine on ``model`` (a TorchLlamaModel)."""
    from pagedattn.engine.llm_engine import LLMEngine
    from pagedattn.sampling_params import SamplingParams

    def engine() -> LLMEngine:
        config = EngineConfig(
            cache=CacheConfig(page_size=16, kv_cache_mib=1024, enable_prefix_caching=False),
            scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=4096),
            backend="torch",
            device=device,
        )
        return LLMEngine(config, model)

    def run(e: LLMEngine, batch: list[list[int]], n: int) -> tuple[float, list[Any]]:
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        start = time.perf_counter()
        ids = [e.add_request(p, params) for p in batch]
        last: dict[str, Any] = {}
        while e.has_unfinished_requests():
            for out in e.step():
                last[out.request_id] = out
        return time.perf_counter() - start, [last[i] for i in ids]

    e = engine()
    run(e, [prompts[0][:32]], 4)  # warm-up
    prompt = prompts[0][: sizes["prompt_len"]]
    times = []
    for _ in range(3):
        _, (out,) = run(e, [prompt], 1)
        times.append(out.metrics.first_token_time - out.metrics.first_scheduled_time)
    _, (out,) = run(e, [prompt], sizes["output_len"])
    m = out.metrics
    decode = (sizes["output_len"] - 1) / (m.last_token_time - m.first_token_time)
    elapsed, _ = run(engine(), prompts[1 : 1 + sizes["batch"]], sizes["output_len"])
    return {
        "prefill_tok_s": len(prompt) / statistics.median(times),
        "decode_tok_s": decode,
        "batch_tok_s": sizes["batch"] * sizes["output_len"] / elapsed,
    }


def hf_model(config: ModelConfig, weights: dict[str, np.ndarray], device: str, dtype: str) -> Any:
    """``transformers.LlamaForCausalLM`` of the same shape holding the same weights."""
    import torch
    import transformers

    shape: dict[str, Any] = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        rope_theta=config.rope_theta,
        rms_norm_eps=config.rms_norm_eps,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
    )
    model: Any = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape))
    state = {k: torch.from_numpy(v) for k, v in weights.items()}
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    return model.to(device=device, dtype=getattr(torch, dtype)).eval()


def measure_hf(
    model: Any, device: str, sizes: dict[str, int], prompts: list[list[int]]
) -> dict[str, float]:
    """The same three figures for HF ``generate`` (greedy, ``min_new_tokens`` = max)."""
    import torch

    def timed(fn: Any) -> float:
        _sync(torch, device)
        start = time.perf_counter()
        fn()
        _sync(torch, device)
        return time.perf_counter() - start

    def gen(batch: list[list[int]], n: int) -> None:
        width = max(len(p) for p in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
            do_sample=False, pad_token_id=0,
        )  # fmt: skip

    prompt = prompts[0][: sizes["prompt_len"]]
    ids = torch.tensor([prompt], device=device)
    n = sizes["output_len"]
    with torch.inference_mode():
        gen([prompt[:32]], 4)  # warm-up
        prefill = statistics.median(timed(lambda: model(ids, use_cache=True)) for _ in range(3))
        decode_s = timed(lambda: gen([prompt], n)) - timed(lambda: gen([prompt], 1))
        batch_s = timed(lambda: gen(prompts[1 : 1 + sizes["batch"]], n))
    return {
        "prefill_tok_s": len(prompt) / prefill,
        "decode_tok_s": (n - 1) / max(decode_s, 1e-9),
        "batch_tok_s": sizes["batch"] * n / batch_s,
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point; prints a table and writes ``--json``. Returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers.gpu", description=__doc__)
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--quick", action="store_true", help="4 layers, short prompts")
    parser.add_argument("--no-hf", dest="hf", action="store_false")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    from pagedattn.backends import BackendError
    from pagedattn.model.torch_model import TorchLlamaModel

    sizes = QUICK if args.quick else FULL
    config = ModelConfig(**{**SMOLLM2_SHAPE, "num_layers": sizes["layers"]})
    rng = np.random.default_rng(1)
    lens = [sizes["prompt_len"]] + [sizes["batch_prompt"]] * sizes["batch"]
    prompts = [rng.integers(3, config.vocab_size, n).tolist() for n in lens]
    weights = random_weights(config)
    try:
        ours_model = TorchLlamaModel(config, weights, device=args.device, dtype=args.dtype)
    except BackendError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import torch

    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    results: dict[str, Any] = {"device": name, "torch": torch.__version__, "sizes": sizes}
    results["dtype"] = args.dtype
    results["ours"] = measure_ours(ours_model, args.device, sizes, prompts)
    del ours_model
    if args.hf:
        try:
            hf = hf_model(config, weights, args.device, args.dtype)
        except ImportError as exc:
            results["hf"] = None
            print(f"HF transformers: not measured ({exc})")
        else:
            results["hf"] = measure_hf(hf, args.device, sizes, prompts)
    print(
        f"bench gpu: random SmolLM2-shaped model ({config.num_layers} layers), {name}, "
        f"torch {torch.__version__}, {args.dtype}"
    )
    print(f"{'metric':<34}{'ours':>12}{'HF':>12}{'ours/HF':>10}")
    labels = {
        "prefill_tok_s": f"prefill tok/s ({sizes['prompt_len']} tokens)",
        "decode_tok_s": f"decode tok/s ({sizes['output_len']} tokens)",
        "batch_tok_s": f"batch-{sizes['batch']} generated tok/s",
    }
    for key, label in labels.items():
        ours, hf_value = results["ours"][key], (results.get("hf") or {}).get(key)
        ratio = f"{ours / hf_value:.2f}x" if hf_value else "-"
        hf_text = f"{hf_value:.1f}" if hf_value else "-"
        print(f"{label:<34}{ours:>12.1f}{hf_text:>12}{ratio:>10}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
