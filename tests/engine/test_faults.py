"""Faults: a failed step never poisons the prefix cache; one bad request ends alone.

Faults are injected in-process by wrapping the model (the engine's own model runner and
scheduler run unchanged); the oracles are fresh engines that never saw a fault.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.engine.faults import FaultyModel, RowFaultModel
from tests.engine.helpers import (
    GREEDY,
    assert_all_pages_free,
    drain,
    make_engine,
    solo,
    tiny_model,
    tokens,
)
from tests.model.tiny import random_weights, tiny_config, write_tiny_gguf

from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.model.forward_batch import ForwardBatch
from pagedattn.model.llama import LlamaModel
from pagedattn.model.loader import load_model
from pagedattn.sampling_params import SamplingParams

MODEL = tiny_model(seed=5)
RNG = np.random.default_rng(11)
PROMPT = RNG.integers(3, MODEL.config.vocab_size, 30).tolist()  # 7 full pages of 4 + 2
OTHERS = [RNG.integers(3, MODEL.config.vocab_size, n).tolist() for n in (9, 14, 6)]
OPTIONS: dict[str, Any] = {"page_size": 4, "num_pages": 64}


def fresh(prompt: list[int], params: SamplingParams = GREEDY, **options: Any) -> list[int]:
    return solo(MODEL, prompt, params, **{**OPTIONS, **options})


@pytest.mark.parametrize("fail_call", [1, 3])
def test_failed_step_never_serves_unwritten_pages(fail_call: int) -> None:
    # chunks of 8 tokens: calls 1, 2 write pages 0-3; call 3 would write pages 4-5
    options = {**OPTIONS, "max_num_batched_tokens": 8, "long_prefill_token_threshold": 8}
    model = FaultyModel(MODEL, {fail_call})
    engine = make_engine(model, **options)
    failed = drain(engine, {0: [("a", PROMPT, GREEDY)]})["a"]
    assert failed[-1].finished and failed[-1].outputs[0].finish_reason == "error"
    assert "MemoryError" in (failed[-1].error or "") and tokens(failed) == []
    assert_all_pages_free(engine)
    again = drain(engine, {0: [("b", PROMPT, GREEDY)]})["b"]
    assert tokens(again) == fresh(PROMPT, **options)
    # only pages written by a forward that succeeded are served: 8 tokens per good call
    assert again[-1].num_cached_tokens == 8 * (fail_call - 1)
    assert engine.get_stats()["num_finished"] == {"error": 1, "length": 1}
    assert_all_pages_free(engine)


def test_whole_step_failure_fails_only_that_steps_requests() -> None:
    model = FaultyModel(MODEL, {2})
    engine = make_engine(model, **OPTIONS, max_num_seqs=2)
    arrivals = {0: [("a", OTHERS[0], GREEDY), ("b", OTHERS[1], GREEDY)]}
    arrivals[1] = [("c", OTHERS[2], GREEDY), ("d", PROMPT, GREEDY)]  # wait: 2 seqs at most
    outs = drain(engine, arrivals)
    for rid in ("a", "b"):
        assert outs[rid][-1].outputs[0].finish_reason == "error", rid
    # the waiting requests were not in the failed step: they run as if nothing happened
    assert tokens(outs["c"]) == fresh(OTHERS[2])
    assert tokens(outs["d"]) == fresh(PROMPT)
    assert outs["d"][-1].num_cached_tokens == 0
    assert_all_pages_free(engine)


def test_keyboard_interrupt_in_a_step_fails_the_step_and_propagates() -> None:
    class Interrupting(FaultyModel):
        def forward(self, batch: ForwardBatch, kv: Any) -> np.ndarray:
            self.calls += 1
            if self.calls == 1:
                raise KeyboardInterrupt
            return np.asarray(self.model.forward(batch, kv))

    engine = make_engine(Interrupting(MODEL, set()), **OPTIONS)
    engine.add_request(PROMPT, GREEDY, request_id="a")
    with pytest.raises(KeyboardInterrupt):
        engine.step()
    (out,) = engine.step()  # the failed request's final output comes with the next step
    assert out.request_id == "a" and out.outputs[0].finish_reason == "error"
    assert not engine.has_unfinished_requests()
    again = drain(engine, {0: [("b", PROMPT, GREEDY)]})["b"]
    assert tokens(again) == fresh(PROMPT) and again[-1].num_cached_tokens == 0
    assert_all_pages_free(engine)


SAMPLED = SamplingParams(temperature=0.8, seed=4, max_tokens=8, ignore_eos=True)


def test_nan_logits_row_fails_only_its_request() -> None:
    engine = make_engine(RowFaultModel(MODEL, "nan", len(PROMPT) - 1), **OPTIONS)
    arrivals = {0: [("bad", PROMPT, SAMPLED), ("a", OTHERS[0], GREEDY)]}
    arrivals[1] = [("b", OTHERS[1], SAMPLED)]
    outs = drain(engine, arrivals)
    bad = outs["bad"][-1]
    assert bad.outputs[0].finish_reason == "error" and "NaN" in (bad.error or "")
    assert tokens(outs["bad"]) == []
    assert tokens(outs["a"]) == fresh(OTHERS[0])
    assert tokens(outs["b"]) == fresh(OTHERS[1], SAMPLED)
    assert_all_pages_free(engine)


@pytest.fixture(scope="module")
def padded(tmp_path_factory: pytest.TempPathFactory) -> tuple[LlamaModel, LlamaModel, Any]:
    """A model with 300 embedding rows (28 padded), the same model without the padded rows
    (the oracle: its logits over the 272 real ids are identical), and the 272-token tokenizer."""
    path: Path = tmp_path_factory.mktemp("padded") / "tiny.gguf"
    tokenizer = load_model(write_tiny_gguf(path, tiny_config(), random_weights(tiny_config(), 2)))
    config = tiny_config(vocab_size=300)
    weights = random_weights(config, 2)
    real = dict(weights)
    real["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"][:272]
    oracle = LlamaModel(tiny_config(), real)
    return LlamaModel(config, weights), oracle, tokenizer.tokenizer


def test_padded_vocab_ids_are_never_sampled(padded: tuple[LlamaModel, LlamaModel, Any]) -> None:
    model, oracle, tokenizer = padded
    assert tokenizer.vocab_size == 272 and model.config.vocab_size == 300
    prompts = {"forced": PROMPT, "a": OTHERS[0], "b": OTHERS[1]}
    params = {"forced": GREEDY, "a": SAMPLED, "b": GREEDY}
    faulty = RowFaultModel(model, "padded", len(PROMPT) - 1, padded_id=290)
    engine = make_engine(faulty, tokenizer, **OPTIONS)
    outs = drain(engine, {0: [(k, p, params[k]) for k, p in prompts.items()]})
    for key, prompt in prompts.items():
        assert outs[key][-1].error is None, key
        # the oracle has no padded rows at all: the same tokens, and every one a real token
        want = tokens(
            drain(make_engine(oracle, tokenizer, **OPTIONS), {0: [(key, prompt, params[key])]})[key]
        )
        assert tokens(outs[key]) == want, key
        assert all(t < 272 for t in tokens(outs[key]))
    assert len(tokens(outs["forced"])) == GREEDY.max_tokens
    assert_all_pages_free(engine)


def test_undecodable_token_fails_only_its_request(
    padded: tuple[LlamaModel, LlamaModel, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, oracle, tokenizer = padded
    engine: LLMEngine = make_engine(oracle, tokenizer, **OPTIONS)
    want = {
        k: tokens(drain(make_engine(oracle, tokenizer, **OPTIONS), {0: [(k, p, GREEDY)]})[k])
        for k, p in (("a", OTHERS[0]), ("b", OTHERS[1]))
    }
    # the first token of "a" that "b" never generates cannot be decoded
    index = next(i for i, t in enumerate(want["a"]) if t not in want["b"])
    poison = want["a"][index]
    real_decode = tokenizer.decode

    def decode(ids: Any, *args: Any, **kwargs: Any) -> str:
        if poison in list(ids):
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        return str(real_decode(ids, *args, **kwargs))

    monkeypatch.setattr(tokenizer, "decode", decode)
    outs = drain(engine, {0: [("a", OTHERS[0], GREEDY), ("b", OTHERS[1], GREEDY)]})
    assert outs["a"][-1].outputs[0].finish_reason == "error"
    assert "UnicodeDecodeError" in (outs["a"][-1].error or "")
    assert tokens(outs["a"]) == want["a"][: index + 1]
    assert tokens(outs["b"]) == want["b"] and outs["b"][-1].error is None
    assert_all_pages_free(engine)


def test_a_raising_logits_processor_fails_only_its_request() -> None:
    def broken(history: Any, row: np.ndarray) -> np.ndarray:
        if len(history) == 2:
            raise KeyError("processor state lost")
        return row

    bad = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logits_processors=[broken])
    engine = make_engine(MODEL, **OPTIONS)
    outs = drain(engine, {0: [("bad", PROMPT, bad), ("a", OTHERS[0], SAMPLED)]})
    assert outs["bad"][-1].outputs[0].finish_reason == "error"
    assert "processor state lost" in (outs["bad"][-1].error or "")
    assert tokens(outs["bad"]) == fresh(PROMPT)[:2]  # two good tokens, then the failure
    assert tokens(outs["a"]) == fresh(OTHERS[0], SAMPLED)
    assert_all_pages_free(engine)
