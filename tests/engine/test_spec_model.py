"""Speculation on the real SmolLM2 weights: grounded requests (repeat, quote, rewrite), greedy
and seeded, in one batch: tokens and logprobs bitwise those of the same engine without
speculation, with drafts really accepted."""

from __future__ import annotations

from typing import Any

import pytest

from pagedattn.bench.spec import passages
from pagedattn.engine.llm import engine_config
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.model.build import build_model, resolve_model_backend
from pagedattn.model.loader import load_model
from pagedattn.sampling_params import SamplingParams

pytestmark = pytest.mark.model


def _run(engine: LLMEngine, reqs: list[tuple[list[int], SamplingParams]]) -> dict[str, Any]:
    for i, (ids, params) in enumerate(reqs):
        engine.add_request(ids, params, request_id=f"r{i}")
    got: dict[str, Any] = {f"r{i}": ([], []) for i in range(len(reqs))}
    while engine.has_unfinished_requests():
        for out in engine.step():
            c = out.outputs[0]
            got[out.request_id][0].extend(c.token_ids)
            got[out.request_id][1].extend(c.logprobs or [])
        engine.cache_manager.check_integrity()
    return got


def test_grounded_requests_are_bitwise_the_same_with_speculation() -> None:
    loaded = load_model(None)
    model = build_model(loaded, resolve_model_backend("numpy", None))
    tok = loaded.tokenizer
    p = passages(2, lines=4)
    messages = [
        f"Repeat the following passage exactly, word for word:\n\n{p[0]}",
        f"Quote the following passage in full:\n\n{p[1]}",
    ]
    prompts = [tok.encode_chat([{"role": "user", "content": m}]) for m in messages]
    reqs = []
    for ids in prompts:
        reqs.append((ids, SamplingParams(temperature=0, max_tokens=48, logprobs=2)))
        seeded = SamplingParams(temperature=0.7, top_p=0.9, seed=7, max_tokens=48, logprobs=1)
        reqs.append((ids, seeded))
    results = {}
    stats = {}
    for spec in (None, "ngram"):
        config = engine_config(None, speculative=spec, page_size=16, max_num_seqs=4)
        engine = LLMEngine(config, model, tok, model_fingerprint=loaded.fingerprint)
        results[spec] = _run(engine, reqs)
        stats[spec] = engine.get_stats()
    assert stats["ngram"]["spec_num_drafted_tokens"] > 0
    assert stats["ngram"]["spec_num_accepted_tokens"] > 0
    assert stats["ngram"]["num_steps"] < stats[None]["num_steps"]
    for rid, (ids, lps) in results[None].items():
        assert len(ids) > 8
        assert results["ngram"][rid] == (ids, lps), rid
