"""The engine on the embedded SmolLM2-135M: batched greedy equals direct greedy decoding."""

from __future__ import annotations

import pytest
from tests.model.paging import greedy

from pagedattn.engine.llm import LLM
from pagedattn.sampling_params import SamplingParams


@pytest.mark.model
def test_llm_chat_batch_equals_direct_greedy_decoding() -> None:
    llm = LLM(page_size=16, num_pages=64, max_num_batched_tokens=24)  # prompts are chunked
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
        completion = result.outputs[0]
        assert completion.token_ids == greedy(model, prompt, 6)  # type: ignore[arg-type]
        assert completion.text == tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        assert completion.finish_reason == "length"
    # The shared chat-template prefix is reused from the prefix cache by the second request.
    assert llm.engine.get_stats()["prefix_cache_hits"] > 0
