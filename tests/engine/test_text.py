"""Text through the engine with the tiny byte-level tokenizer: stop strings, stop ids, eos,
max_tokens, and the LLM facade."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.engine.helpers import drain, make_engine
from tests.model.tiny import random_weights, tiny_config, write_tiny_gguf

from pagedattn.engine.llm import LLM, engine_config
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.model.llama import LlamaModel
from pagedattn.model.loader import load_model
from pagedattn.sampling_params import SamplingParams

PROMPT = "the cat sat on the mat"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[LlamaModel, object]:
    config = tiny_config()
    path: Path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    loaded = load_model(write_tiny_gguf(path, config, random_weights(config, 9)))
    return LlamaModel(loaded.config, loaded.weights), loaded.tokenizer


def _engine(tiny: tuple[LlamaModel, object], **kwargs: object) -> LLMEngine:
    return make_engine(tiny[0], tiny[1], page_size=4, num_pages=64, **kwargs)


def _run(engine: LLMEngine, params: SamplingParams) -> tuple[list[str], list[int], str | None]:
    outs = drain(engine, {0: [("r", PROMPT, params)]})["r"]
    return (
        [o.outputs[0].text for o in outs],
        [t for o in outs for t in o.outputs[0].token_ids],
        outs[-1].outputs[0].finish_reason,
    )


def test_stop_string_spanning_tokens_never_leaks_when_streamed(tiny: tuple) -> None:
    free = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    deltas, ids, reason = _run(_engine(tiny), free)
    full = "".join(deltas)
    assert reason == "length" and len(ids) == 40
    # A stop string from the middle of one token's text to the start of a later token's.
    k = next(i for i in range(5, 35) if deltas[i] and deltas[i + 1] and deltas[i + 2])
    stop = deltas[k][-1] + deltas[k + 1] + deltas[k + 2][:1]
    expected = full[: full.find(stop)]
    deltas2, ids2, reason2 = _run(
        _engine(tiny), SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=stop)
    )
    assert reason2 == "stop"
    assert "".join(deltas2) == expected
    streamed = ""
    for d in deltas2:
        streamed += d
        assert expected.startswith(streamed)  # nothing emitted is ever taken back
    assert ids2 == ids[: len(ids2)] and len(ids2) < 40


def test_stop_token_ids_eos_and_ignore_eos(tiny: tuple) -> None:
    _, tokenizer = tiny
    _, ids, _ = _run(_engine(tiny), SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    target = ids[5]
    cut = ids.index(target) + 1
    _, ids2, reason = _run(
        _engine(tiny),
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop_token_ids=[target]),
    )
    assert reason == "stop" and ids2 == ids[:cut]  # the stop id is reported, then nothing
    # End-of-sequence: make `target` the eos id by using a tokenizer-less engine.
    config = tiny_config(eos_token_id=target)
    eos_model = LlamaModel(config, random_weights(config, 9))
    prompt_ids = tokenizer.encode(PROMPT)
    for ignore, expected_len, expected_reason in ((False, cut, "stop"), (True, 12, "length")):
        engine = make_engine(eos_model, page_size=4, num_pages=64)
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=ignore)
        outs = drain(engine, {0: [("r", prompt_ids, params)]})["r"]
        got = [t for o in outs for t in o.outputs[0].token_ids]
        assert len(got) == expected_len and outs[-1].outputs[0].finish_reason == expected_reason
        assert got == ids[:expected_len]


@pytest.mark.parametrize("max_tokens", [1, 2, 7])
def test_max_tokens_is_exact(tiny: tuple, max_tokens: int) -> None:
    params = SamplingParams(temperature=0.7, seed=1, max_tokens=max_tokens, ignore_eos=True)
    _, ids, reason = _run(_engine(tiny), params)
    assert len(ids) == max_tokens and reason == "length"


def test_llm_generate_returns_results_in_input_order(tiny: tuple) -> None:
    llm = LLM(engine=_engine(tiny, max_num_seqs=2))
    prompts = ["the", "a much longer prompt about the weather", "on", [5, 6, 7]]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (9, 2, 5, 3)]
    results = llm.generate(prompts, params, use_tqdm=False)
    assert [len(r.outputs[0].token_ids) for r in results] == [9, 2, 5, 3]
    # vLLM's shape: the prompt text, or None for a token-id prompt (its ids are given).
    assert [r.prompt for r in results] == [*prompts[:3], None]
    assert results[3].prompt_token_ids == [5, 6, 7]
    for r, p in zip(results, prompts, strict=True):
        single = LLM(engine=_engine(tiny)).generate(p, params[prompts.index(p)], use_tqdm=False)
        assert single[0].outputs == r.outputs
    chat = llm.chat([{"role": "user", "content": "hi"}], params[2], use_tqdm=False)
    assert len(chat) == 1 and len(chat[0].outputs[0].token_ids) == 5
    with pytest.raises(ValueError, match="expected 1 or 4"):
        llm.generate(prompts, params[:2], use_tqdm=False)


def test_llm_generate_progress_never_writes_to_stdout(
    tiny: tuple, capsys: pytest.CaptureFixture[str]
) -> None:
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    LLM(engine=_engine(tiny)).generate(["the", "on"], params)  # progress bar on (the default)
    assert capsys.readouterr().out == ""


def test_engine_config_rejects_unknown_options() -> None:
    with pytest.raises(ValueError, match="unknown engine option"):
        engine_config(page_sise=4)
    assert engine_config(page_size=8, max_num_seqs=3, seed=2).cache.page_size == 8
