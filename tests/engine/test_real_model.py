"""The engine on the embedded SmolLM2-135M: batched greedy equals direct greedy decoding."""

from __future__ import annotations

import pytest
from tests.model.paging import greedy

from pagedattn.engine.llm import LLM
from pagedattn.model.registry import embedded_model_path
from pagedattn.sampling_params import SamplingParams


@pytest.mark.model
def test_llm_chat_batch_equals_direct_greedy_decoding() -> None:
    # prompts are chunked, 24 tokens a step: the first prompt's first page is written before
    # the second prompt is admitted
    llm = LLM(
        page_size=16, num_pages=64, max_num_batched_tokens=24, long_prefill_token_threshold=24
    )
    tokenizer = llm.engine.tokenizer
    conversations = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "user", "content": "Name a primary colour."}],
    ]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    results = llm.chat(conversations, params, use_tqdm=False)
    model = llm.engine.runner.model
    for conv, result in zip(conversations, results, strict=True):
        prompt = tokenizer.encode_chat(conv)
        assert result.prompt_token_ids == prompt
        c = result.outputs[0]
        assert c.token_ids == greedy(model, prompt, 6)  # type: ignore[arg-type]
        assert c.text == tokenizer.decode(c.token_ids, skip_special_tokens=True)
        assert c.finish_reason == "length"
    # The shared chat-template prefix is reused from the prefix cache by the second request.
    assert llm.engine.get_stats()["prefix_cache_hits"] > 0


@pytest.mark.model
@pytest.mark.hf
@pytest.mark.parametrize(("kv_cache_dtype", "tolerance"), [("float32", 1e-3), ("float16", 2e-2)])
def test_logprobs_and_prompt_logprobs_equal_hf_transformers_on_the_same_gguf(
    kv_cache_dtype: str, tolerance: float
) -> None:
    """Log-softmax of the raw logits, prompt (first None) and generated, vs HF within 1e-3;
    with a float16 KV cache (keys and values rounded to 11 significant bits) within 2e-2
    (measured 6.8e-3, against 2.7e-5 with float32), HF's most likely token still listed."""
    import os

    import numpy as np

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    llm = LLM(page_size=16, num_pages=64, kv_cache_dtype=kv_cache_dtype)
    assert llm.engine.page_pool.kv.dtype == np.dtype(kv_cache_dtype)
    prompt = "The capital of France is Paris, and the capital of Italy is"
    params = SamplingParams(
        temperature=0, max_tokens=4, ignore_eos=True, logprobs=5, prompt_logprobs=3
    )
    (out,) = llm.generate([prompt], params, use_tqdm=False)
    c = out.outputs[0]
    path = embedded_model_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    ids = out.prompt_token_ids + c.token_ids
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), -1).numpy()
    assert out.prompt_logprobs is not None and out.prompt_logprobs[0] is None
    positions = [(i, p) for i, p in enumerate(out.prompt_logprobs) if p is not None]
    positions += [(len(out.prompt_token_ids) + j, p) for j, p in enumerate(c.logprobs or [])]
    assert len(positions) == len(ids) - 1
    worst = 0.0
    for i, pos in positions:
        row = ref[i - 1]
        assert next(iter(pos)) == ids[i]
        for token_id, lp in pos.items():
            worst = max(worst, abs(lp.logprob - row[token_id]))
        assert int(np.argmax(row)) in pos  # HF's most likely token is listed
    assert worst < tolerance
    assert c.cumulative_logprob == pytest.approx(
        sum(ref[len(out.prompt_token_ids) - 1 + j, t] for j, t in enumerate(c.token_ids)),
        abs=4 * tolerance,
    )
    assert c.logprobs is not None and c.logprobs[0][c.token_ids[0]].rank == 1  # greedy
