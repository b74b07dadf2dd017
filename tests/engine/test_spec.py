"""Speculative decoding never changes the output: with n-gram drafts on, every request's tokens,
text, logprobs and finish are bitwise those of the same requests run without speculation (the
oracle: the same engine with ``speculative=None``), and no rejected draft's KV is ever kept."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from tests.engine.helpers import assert_all_pages_free
from tests.model.tiny import random_weights, tiny_config, write_tiny_gguf

from pagedattn.cache.hashing import prefix_page_hashes
from pagedattn.engine.llm import engine_config
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.model.llama import LlamaModel
from pagedattn.model.loader import load_model
from pagedattn.sampling_params import SamplingParams

PAGE = 4
TEXTS = [
    "the cat sat on the mat. the cat sat on the mat. the cat",
    "one two three four, one two three four, one two",
    "to be or not to be, that is the question; to be or",
    '{"name": "ann", "age": 3}, {"name": "bob", "age": 4}, {"name":',
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return",
    "rain on the plain in spain, rain on the",
    "abc abc abc abc abc",
    "where there is a will there is a way; where there",
]


@dataclasses.dataclass
class Result:
    token_ids: list[int]
    text: str
    logprobs: list[Any]
    cumulative_logprob: float | None
    finish_reason: str | None
    stop_reason: int | str | None
    delta_sizes: list[int]  # tokens per step output


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[LlamaModel, Any]:
    config = tiny_config()
    path: Path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    loaded = load_model(write_tiny_gguf(path, config, random_weights(config, 9)))
    return LlamaModel(loaded.config, loaded.weights), loaded.tokenizer


def run(
    engine: LLMEngine, arrivals: dict[int, list[tuple[str, str, SamplingParams]]]
) -> dict[str, Result]:
    """Step until idle (requests of ``arrivals[i]`` added before step i), checking the cache
    between steps; each request's merged result."""
    results: dict[str, Result] = {}
    step = 0
    while engine.has_unfinished_requests() or any(s >= step for s in arrivals):
        for rid, prompt, params in arrivals.get(step, []):
            engine.add_request(prompt, params, request_id=rid)
            results[rid] = Result([], "", [], None, None, None, [])
        for out in engine.step():
            r, c = results[out.request_id], out.outputs[0]
            r.token_ids += c.token_ids
            r.text += c.text
            r.logprobs += c.logprobs or []
            r.cumulative_logprob = c.cumulative_logprob
            r.finish_reason, r.stop_reason = c.finish_reason, c.stop_reason
            r.delta_sizes.append(len(c.token_ids))
        engine.cache_manager.check_integrity()  # no unwritten page registered between steps
        step += 1
    return results


def _stop_point(ids: list[int]) -> int | None:
    """The first position that ends a run of 3 repeated tokens with a token not seen before:
    drafts continue the run there, so a stop at it lands inside a verified run."""
    for p in range(4, len(ids)):
        if ids[p] != ids[p - 1] == ids[p - 2] == ids[p - 3] and ids[p] not in ids[:p]:
            return p
    return None


def requests(
    reference: dict[str, Result] | None = None, tokenizer: Any = None
) -> list[tuple[str, str, SamplingParams]]:
    """32 requests, greedy and seeded (some with penalties, min_tokens, logprobs), max_tokens
    from 5 to 40. With ``reference`` (their outputs without stops), four greedy ones stop at a
    string and four at a token id, each first met where a run of repeated tokens ends."""
    out = []
    for i in range(32):
        prompt = TEXTS[i % len(TEXTS)]
        kw: dict[str, Any] = {"max_tokens": 5 + (i * 7) % 36, "ignore_eos": True, "logprobs": i % 3}
        if i % 4 == 3:
            kw |= {"temperature": 0.8, "top_p": 0.95, "seed": 100 + i}
            if i % 8 == 3:
                kw |= {"presence_penalty": 0.5, "min_tokens": 2}
        else:
            kw |= {"temperature": 0.0}
            if i % 8 == 4:
                kw |= {"repetition_penalty": 1.2}
        if i % 4 in (1, 2):
            prompt = TEXTS[0] if i % 8 < 4 else TEXTS[4]
            kw["max_tokens"] = 40
        ref = None if reference is None else reference[f"r{i}"]
        at = None if ref is None else _stop_point(ref.token_ids)
        if ref is not None and at is not None and i % 4 == 1:
            before = tokenizer.decode(ref.token_ids[:at])
            piece = tokenizer.decode(ref.token_ids[: at + 1])[len(before) :]
            if piece.isprintable() and piece and piece not in before:
                kw["stop"] = piece
        if ref is not None and at is not None and i % 4 == 2:
            kw["stop_token_ids"] = (ref.token_ids[at],)
        out.append((f"r{i}", prompt, SamplingParams(**kw)))
    return out


def staggered(reqs: list[tuple[str, str, SamplingParams]]) -> dict[int, list[Any]]:
    """Four arrive every third step: prefills mix with drafted decodes."""
    return {3 * (i // 4): reqs[i : i + 4] for i in range(0, len(reqs), 4)}


def engine(tiny: tuple[LlamaModel, Any], speculative: str | None, **kw: Any) -> LLMEngine:
    # rows treated as free: every sequence drafts whenever an n-gram matches (most verifies)
    kw = {
        "page_size": PAGE,
        "num_pages": 512,
        "max_num_seqs": 32,
        "speculative_row_cost": 0.0,
        **kw,
    }
    return LLMEngine(engine_config(speculative=speculative, **kw), tiny[0], tiny[1])


def test_32_requests_are_bitwise_the_same_with_and_without_speculation(tiny: Any) -> None:
    free = run(engine(tiny, None), staggered(requests()))
    reqs = requests(free, tiny[1])
    assert sum(bool(p.stop) for _, _, p in reqs) >= 4
    assert sum(bool(p.stop_token_ids) for _, _, p in reqs) >= 4
    plain = run(engine(tiny, None), staggered(reqs))
    spec_engine = engine(tiny, "ngram", num_speculative_tokens=6)
    spec = run(spec_engine, staggered(reqs))
    stats = spec_engine.get_stats()
    assert stats["spec_num_drafted_tokens"] > 0 and stats["spec_num_accepted_tokens"] > 0
    assert 0 < stats["spec_acceptance_ratio"] <= 1
    for rid, want in plain.items():
        got = spec[rid]
        assert got.token_ids == want.token_ids, rid
        assert got.text == want.text, rid
        assert got.logprobs == want.logprobs, rid  # Logprob floats compared exactly
        assert got.cumulative_logprob == want.cumulative_logprob, rid
        assert (got.finish_reason, got.stop_reason) == (want.finish_reason, want.stop_reason)
    # Not vacuous: several tokens per step, and finishes inside an accepted run.
    assert any(max(r.delta_sizes) > 1 for r in spec.values())
    assert max(plain[r].delta_sizes[-1] for r in plain) <= 1
    multi_finish = {spec[r].finish_reason for r in spec if spec[r].delta_sizes[-1] > 1}
    assert {"stop", "length"} <= multi_finish
    stopped = [r for r in spec if spec[r].finish_reason == "stop"]
    assert any(isinstance(spec[r].stop_reason, str) for r in stopped)
    assert any(isinstance(spec[r].stop_reason, int) for r in stopped)
    assert_all_pages_free(spec_engine)


def _final_tokens(results: dict[str, Result], prompts: dict[str, list[int]]) -> list[list[int]]:
    return [prompts[rid] + r.token_ids for rid, r in results.items()]


def test_no_rejected_draft_reaches_the_prefix_index_or_the_disk_tier(
    tiny: Any, tmp_path: Path
) -> None:
    reqs = requests()
    stores = {spec: tmp_path / f"store-{spec}" for spec in (None, "ngram")}
    engines = {s: engine(tiny, s, kv_store=str(d)) for s, d in stores.items()}
    results = {s: run(e, staggered(reqs)) for s, e in engines.items()}
    for rid, want in results[None].items():
        assert results["ngram"][rid].token_ids == want.token_ids, rid
    assert engines["ngram"].get_stats()["spec_num_drafted_tokens"] > 0
    rejected = engines["ngram"].get_stats()
    assert rejected["spec_num_drafted_tokens"] > rejected["spec_num_accepted_tokens"]
    tok = tiny[1]
    prompts = {rid: [int(t) for t in tok.encode(p)] for rid, p, _ in reqs}
    spec_engine = engines["ngram"]
    valid = {
        h
        for ids in _final_tokens(results["ngram"], prompts)
        for h in prefix_page_hashes(ids, PAGE, spec_engine.namespace)
    }
    allocator = spec_engine.cache_manager.allocator
    indexed = set(allocator.cached_hashes())
    assert indexed and indexed <= valid  # every cached page holds the request's real tokens
    for e in engines.values():
        e.close()
    on_disk = {
        s: {bytes.fromhex(p.name.removesuffix(".page")) for p in d.rglob("*.page")}
        for s, d in stores.items()
    }
    # Output pages reached the tier (not only prompts), and only pages of real tokens did.
    prompt_pages = {
        h for ids in prompts.values() for h in prefix_page_hashes(ids, PAGE, spec_engine.namespace)
    }
    assert on_disk["ngram"] - prompt_pages and on_disk["ngram"] <= valid
    # A later request sharing a finished request's prompt and output: as without speculation.
    rid, _, params = reqs[4]
    follow = tok.decode(prompts[rid] + results[None][rid].token_ids)
    later = {0: [("later", follow, dataclasses.replace(params, max_tokens=12))]}
    plain_later = run(engine(tiny, None), later)["later"]
    for s in (None, "ngram"):
        fresh = engine(tiny, s, kv_store=str(stores[s]))  # restores from the tier
        got = run(fresh, later)["later"]
        assert (got.token_ids, got.logprobs) == (plain_later.token_ids, plain_later.logprobs)
        assert fresh.get_stats()["tier_restored_tokens"] > 0
        fresh.close()


def test_opt_out_and_limits(tiny: Any) -> None:
    off = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, speculative_decoding="off")
    e = engine(tiny, "ngram")
    run(e, {0: [("a", TEXTS[6], off)]})
    assert e.get_stats()["spec_num_drafted_tokens"] == 0
    on = dataclasses.replace(off, speculative_decoding="auto")
    e = engine(tiny, "ngram")
    run(e, {0: [("a", TEXTS[6], on)]})
    assert e.get_stats()["spec_num_drafted_tokens"] > 0
    # A share of the token budget too small for a draft: nothing drafted.
    e = engine(tiny, "ngram", max_num_batched_tokens=64, speculative_token_share=1 / 64)
    run(e, {0: [("a", TEXTS[6], on)]})
    assert e.get_stats()["spec_num_drafted_tokens"] == 0
    with pytest.raises(ValueError, match="speculative_decoding"):
        SamplingParams(speculative_decoding="ngram")
    with pytest.raises(ValueError, match=r"SchedulerConfig\.speculative"):
        engine(tiny, "eagle")
    with pytest.raises(ValueError, match="sliding_window"):
        engine(tiny, "ngram", sliding_window=8)
    with pytest.raises(ValueError, match="ngram_min"):
        engine(tiny, "ngram", ngram_min=5, ngram_max=3)


def test_speculation_under_page_pressure_keeps_the_cache_sound(tiny: Any) -> None:
    """A pool too small for every request: preemptions, drafts skipped for lack of empty
    pages. A preempted request recomputes its KV in prefill chunks whose rounding depends on
    when it was preempted (with or without speculation), so only lengths are compared here;
    the cache stays consistent after every step and is all free at the end."""
    reqs = requests()[:12]
    kw = {"num_pages": 40, "max_num_seqs": 12}
    plain = run(engine(tiny, None, **kw), staggered(reqs))
    e = engine(tiny, "ngram", **kw)
    spec = run(e, staggered(reqs))
    assert e.get_stats()["num_preemptions"] > 0 and e.get_stats()["spec_num_accepted_tokens"] > 0
    for rid in plain:
        assert len(spec[rid].token_ids) == len(plain[rid].token_ids), rid
        assert spec[rid].finish_reason == plain[rid].finish_reason == "length"
    assert_all_pages_free(e)
