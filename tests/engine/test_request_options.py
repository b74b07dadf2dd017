"""Request options through the engine with the tiny byte-level tokenizer: penalties and
logit_bias in greedy decoding against a dense oracle with HF's processors, min_tokens, a stop
string equal to a special token's text, include_stop_str_in_output, skip_special_tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tests.engine.helpers import dense_forward, drain, make_engine
from tests.model.tiny import random_weights, tiny_config, write_tiny_gguf

from pagedattn.engine.llm import merge_delta
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.engine.outputs import CompletionOutput, RequestOutput
from pagedattn.model.llama import LlamaModel
from pagedattn.model.loader import load_model
from pagedattn.sampling_params import SamplingParams

torch = pytest.importorskip("torch")
generation = pytest.importorskip("transformers.generation.logits_process")

PROMPT = "the cat sat on the mat"
IM_START, IM_END = 1, 2  # tests/model/tiny.py SPECIALS


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[LlamaModel, object, dict]:
    config = tiny_config()
    weights = random_weights(config, 9)
    path: Path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    loaded = load_model(write_tiny_gguf(path, config, weights))
    return LlamaModel(loaded.config, loaded.weights), loaded.tokenizer, loaded.weights


def _engine(tiny: tuple[LlamaModel, object, dict]) -> LLMEngine:
    return make_engine(tiny[0], tiny[1], page_size=4, num_pages=64)


def _final(engine: LLMEngine, prompt: str | list[int], params: SamplingParams) -> RequestOutput:
    acc: dict[str, RequestOutput] = {}
    for o in drain(engine, {0: [("r", prompt, params)]})["r"]:
        merge_delta(acc, o)
    return acc["r"]


def _one(engine: LLMEngine, params: SamplingParams) -> CompletionOutput:
    return _final(engine, PROMPT, params).outputs[0]


def test_penalties_and_bias_in_greedy_decoding_equal_a_dense_oracle(tiny: tuple) -> None:
    model, tokenizer, weights = tiny
    engine = _engine(tiny)
    prompt = tokenizer.encode(PROMPT)
    bias = {5: 3.0, 70: -100.0}
    params = SamplingParams(
        temperature=0,
        max_tokens=12,
        ignore_eos=True,
        repetition_penalty=1.4,
        frequency_penalty=0.6,
        presence_penalty=0.3,
        logit_bias=bias,
    )
    got = _one(engine, params).token_ids
    rep = generation.RepetitionPenaltyLogitsProcessor(penalty=1.4)
    out: list[int] = []
    for _ in range(12):
        z = dense_forward(model.config, weights, prompt + out)[-1].astype(np.float64)
        for t, b in bias.items():
            z[t] = -np.inf if b == -100 else z[t] + b
        z = rep(torch.tensor([prompt + out]), torch.tensor(z[None]))[0].numpy()
        for j in set(out):
            z[j] -= out.count(j) * 0.6 + 0.3
        out.append(int(np.argmax(z)))
    assert got == out
    plain = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    assert _one(engine, plain).token_ids != got  # the options did change the output


def test_min_tokens_masks_eos_and_stop_ids(tiny: tuple) -> None:
    engine = _engine(tiny)
    # The bias makes the stop id the greedy choice at every step; min_tokens holds it off.
    params = SamplingParams(
        temperature=0, max_tokens=8, min_tokens=3, stop_token_ids=[40], logit_bias={40: 100}
    )
    c = _one(engine, params)
    assert len(c.token_ids) == 4 and c.token_ids[-1] == 40 and 40 not in c.token_ids[:3]
    assert (c.finish_reason, c.stop_reason) == ("stop", 40)


def test_stop_string_equal_to_a_special_token_stops_there(tiny: tuple) -> None:
    engine = _engine(tiny)
    forced = {IM_START: 100.0}  # greedy picks <|im_start|> first
    c = _one(
        engine, SamplingParams(temperature=0, max_tokens=5, stop="<|im_start|>", logit_bias=forced)
    )
    assert c.token_ids == [IM_START] and c.text == ""
    assert (c.finish_reason, c.stop_reason) == ("stop", "<|im_start|>")
    c = _one(
        engine,
        SamplingParams(
            temperature=0,
            max_tokens=5,
            stop="<|im_start|>",
            logit_bias=forced,
            include_stop_str_in_output=True,
        ),
    )
    assert c.text == "<|im_start|>" and c.finish_reason == "stop"
    # min_tokens: the stop string counts only after min_tokens tokens
    c = _one(
        engine,
        SamplingParams(
            temperature=0, max_tokens=5, min_tokens=2, stop="<|im_start|>", logit_bias=forced
        ),
    )
    assert c.token_ids == [IM_START] * 3 and c.finish_reason == "stop"


def test_skip_special_tokens_and_include_stop_str(tiny: tuple) -> None:
    model, tokenizer, _ = tiny
    engine = _engine(tiny)
    forced = {IM_START: 100.0}
    kept = _one(
        engine,
        SamplingParams(temperature=0, max_tokens=2, logit_bias=forced, skip_special_tokens=False),
    )
    assert kept.text == "<|im_start|><|im_start|>"
    skipped = _one(engine, SamplingParams(temperature=0, max_tokens=2, logit_bias=forced))
    assert skipped.text == ""
    plain = _one(engine, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    assert plain.text
    stop = plain.text[0]  # printable in this tiny model's output, the rest is not
    cut = _one(engine, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, stop=stop))
    assert cut.text == plain.text[: plain.text.index(stop)] and cut.stop_reason == stop
    kept = _one(
        engine,
        SamplingParams(
            temperature=0,
            max_tokens=10,
            ignore_eos=True,
            stop=stop,
            include_stop_str_in_output=True,
        ),
    )
    assert kept.text == plain.text[: plain.text.index(stop) + len(stop)]
    del model, tokenizer
