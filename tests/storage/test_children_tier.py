"""n > 1 child requests under the persistent tier: no child's page ever lands on a page that
was freed and restored from the store since, whether the parent request is aborted after its
first child's prefill or its first completion finishes while a sibling runs on. Every answer
and every page is compared with a store-less engine that ran the same requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pagedattn.cache.hashing import prefix_page_hashes
from pagedattn.config import CacheConfig, EngineConfig
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.sampling_params import SamplingParams
from tests.engine.helpers import drain, tiny_model, tokens

PS = 4
MODEL = tiny_model(seed=7)
_rng = np.random.default_rng(23)
PARENT = [int(t) for t in _rng.integers(3, 250, 6)]  # 1 full page + a partial one
STORED = [int(t) for t in _rng.integers(3, 250, 9)]  # 2 full pages the store holds
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def _engine(model: Any, store: Path | None, num_pages: int = 64) -> LLMEngine:
    cache = CacheConfig(page_size=PS, num_pages=num_pages)
    config = EngineConfig(cache=cache, kv_store=None if store is None else str(store))
    return LLMEngine(config, model, model_fingerprint="tiny-7")


def _fill_store(model: Any, store: Path, prompt: list[int]) -> list[int]:
    """A first engine computes ``prompt`` and writes its full pages to the store."""
    writer = _engine(model, store)
    answer = tokens(drain(writer, {0: [("w", prompt, GREEDY)]})["w"])
    writer.close()
    return answer


def _page_kv(engine: LLMEngine, page_hash: bytes) -> bytes:
    page_id = engine.cache_manager.allocator.page_of(page_hash)
    return bytes(engine.page_pool.kv[:, :, page_id].tobytes())


def _by_index(outs: list[Any]) -> dict[int, list[int]]:
    by: dict[int, list[int]] = {}
    for o in outs:
        for c in o.outputs:
            by.setdefault(c.index, []).extend(c.token_ids)
    return by


def test_an_aborted_parent_never_overwrites_pages_restored_from_the_store(tmp_path: Path) -> None:
    scratch = _engine(MODEL, None)
    want = tokens(drain(scratch, {0: [("b", STORED, GREEDY)]})["b"])
    assert _fill_store(MODEL, tmp_path, STORED) == want
    hashes = prefix_page_hashes(STORED[:8], PS, scratch.namespace)
    want_pages = [_page_kv(scratch, h) for h in hashes]

    engine = _engine(MODEL, tmp_path)
    engine.add_request(PARENT, SamplingParams(n=2, max_tokens=4, seed=1), request_id="a")
    engine.step()  # child 0's prefill; child 1 waits for its prompt pages
    assert engine.abort("a")
    outs = drain(engine, {0: [("b", STORED, GREEDY)]})
    assert outs["b"][-1].num_cached_tokens == 8  # both pages restored from the store
    assert tokens(outs["b"]) == want
    assert [_page_kv(engine, h) for h in hashes] == want_pages
    engine.cache_manager.check_integrity()
    again = drain(engine, {0: [("b2", STORED, GREEDY)]})["b2"]  # served by the prefix cache
    assert tokens(again) == want and again[-1].num_cached_tokens == 8
    assert engine.get_stats()["kv_store"]["errors"] == {}


def _stopping_seed() -> tuple[int, list[int], list[int]]:
    """A seed whose completion 0 and 1 (seeds s and s + 1) start with different tokens: the
    request stops on completion 0's first token, which completion 1 never draws."""
    for seed in range(50):
        runs = []
        for i in range(2):
            p = SamplingParams(temperature=1.0, seed=seed + i, max_tokens=10, ignore_eos=True)
            runs.append(tokens(drain(_engine(MODEL, None), {0: [("s", PARENT, p)]})["s"]))
        if runs[0][0] not in runs[1]:
            return seed, runs[0], runs[1]
    raise AssertionError("no seed separates the two completions")


def test_a_parent_finishing_first_leaves_its_siblings_pages_intact(tmp_path: Path) -> None:
    seed, first, sibling = _stopping_seed()
    params = SamplingParams(
        n=2, temperature=1.0, seed=seed, max_tokens=10, ignore_eos=True,
        stop_token_ids=[first[0]],
    )  # fmt: skip
    scratch = _engine(MODEL, None)
    want_b = tokens(drain(scratch, {0: [("b", STORED, GREEDY)]})["b"])
    _fill_store(MODEL, tmp_path, STORED)

    def run(engine: LLMEngine) -> tuple[dict[int, list[int]], list[int], int]:
        engine.add_request(PARENT, params, request_id="a")
        outs = drain(engine, {1: [("b", STORED, GREEDY)]})  # admitted with child 1
        return _by_index(outs["a"]), tokens(outs["b"]), outs["b"][-1].num_cached_tokens

    clean = run(_engine(MODEL, None))
    engine = _engine(MODEL, tmp_path)
    children, answer_b, cached_b = run(engine)
    assert children == clean[0] == {0: first[:1], 1: sibling}
    assert cached_b == 8 and answer_b == want_b == clean[1]
    # every page the sibling filled holds the KV of a store-less run of it, so the store
    # received no foreign KV either
    reference = _engine(MODEL, None)
    one = SamplingParams(temperature=1.0, seed=seed + 1, max_tokens=10, ignore_eos=True)
    assert tokens(drain(reference, {0: [("s", PARENT, one)]})["s"]) == sibling
    full = (PARENT + sibling)[: (len(PARENT) + len(sibling) - 1) // PS * PS]
    hashes = prefix_page_hashes(full, PS, engine.namespace)
    assert [_page_kv(engine, h) for h in hashes] == [_page_kv(reference, h) for h in hashes]
    engine.cache_manager.check_integrity()
    engine.close()
    restarted = _engine(MODEL, tmp_path)  # what the store holds for the sibling's pages
    probe = [*full, 3]
    assert tokens(drain(restarted, {0: [("r", probe, GREEDY)]})["r"]) == tokens(
        drain(_engine(MODEL, None), {0: [("r", probe, GREEDY)]})["r"]
    )
    assert restarted.get_stats()["tier_restored_tokens"] == len(full)


@pytest.mark.model
def test_smollm2_parent_abort_then_a_stored_prompt_answers_as_without_a_store(
    tmp_path: Path,
) -> None:
    base = LLMEngine.from_config(EngineConfig())
    model, tokenizer, fingerprint = base.runner.model, base.tokenizer, base.model_fingerprint

    def engine(store: Path | None) -> LLMEngine:
        config = EngineConfig(kv_store=None if store is None else str(store))
        return LLMEngine(config, model, tokenizer, model_fingerprint=fingerprint)

    text = (
        "The history of the printing press begins in the fifteenth century, when movable type"
        " changed how books were made, sold and read across the whole of Europe and beyond it."
        " Printers in Venice, Paris and London competed for readers, and within fifty years"
        " millions of volumes had been printed on presses that had spread to every trading city"
    )
    prompt_b = engine(None).encode(text)[:48]
    assert len(prompt_b) == 48
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    want = tokens(drain(engine(None), {0: [("b", prompt_b, greedy)]})["b"])
    writer = engine(tmp_path)
    assert tokens(drain(writer, {0: [("b", prompt_b, greedy)]})["b"]) == want
    writer.close()

    reader = engine(tmp_path)
    reader.add_request("Once upon a time", SamplingParams(n=2, max_tokens=8, seed=3), "a")
    reader.step()
    assert reader.abort("a")
    first = drain(reader, {0: [("b", prompt_b, greedy)]})["b"]
    assert first[-1].num_cached_tokens > 0  # restored from the store
    assert tokens(first) == want
    assert tokens(drain(reader, {0: [("b2", prompt_b, greedy)]})["b2"]) == want
    reader.cache_manager.check_integrity()
    reader.close()
