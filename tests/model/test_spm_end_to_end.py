"""A SentencePiece model end to end: the same model as GGUF and as an HF folder gives the same
prompt ids and ``usage.prompt_tokens``; completion text keeps the first generated word's space
(``prompt_text + completion_text == decode(prompt_ids + output_ids)``), streamed or not, through
the engine and the server, for each style of SentencePiece ``tokenizer.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from pagedattn.engine.llm import LLM
from pagedattn.model.loader import load_model
from pagedattn.sampling_params import SamplingParams
from pagedattn.server.app import build_app
from tests.model.spm import write_spm_folder
from tests.model.test_sentencepiece_gguf import SPM_STRINGS, hf_gguf_tokenizer
from tests.server.conftest import TINY_OPTIONS, serve_app

PROMPTS = [
    "It is a truth universally acknowledged",
    "Anne Elliot",
    "<s>Captain Wentworth said",
    "Lady Russell, 日本 said",
    "x",
]


@pytest.fixture(scope="module")
def spm_models(spm_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("spm_models")
    models = {"gguf": spm_gguf}
    for style in ("transformers", "legacy", "metaspace"):
        models[style] = write_spm_folder(root / style, spm_gguf, style)
    return models


@pytest.mark.hf
def test_gguf_and_hf_folder_give_identical_prompt_ids(
    spm_models: dict[str, Path], spm_gguf: Path
) -> None:
    gguf = load_model(spm_models["gguf"]).tokenizer
    folder = load_model(spm_models["transformers"]).tokenizer
    hf = hf_gguf_tokenizer(spm_gguf)
    for text in [*SPM_STRINGS, *PROMPTS]:
        ids = gguf.encode(text)
        assert ids == folder.encode(text)
        theirs = hf.encode(text)
        assert ids == (theirs[1:] if theirs[:2] == [1, 1] else theirs)  # BOS never doubled
        assert gguf.decode(ids, skip_special_tokens=True) == folder.decode(
            ids, skip_special_tokens=True
        )


def _complete(url: str, prompt: str, stream: bool) -> tuple[str, int]:
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    if not stream:
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        data = r.json()
        return data["choices"][0]["text"], data["usage"]["prompt_tokens"]
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    text, usage = "", -1
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            assert "error" not in event, event
            text += "".join(c["text"] for c in event["choices"])
            if event.get("usage"):
                usage = event["usage"]["prompt_tokens"]
    return text, usage


@pytest.mark.hf
def test_server_usage_and_text_equal_for_gguf_and_folder(spm_models: dict[str, Path]) -> None:
    tok = load_model(spm_models["gguf"]).tokenizer
    results: dict[str, list[tuple[str, int]]] = {}
    for source in ("gguf", "transformers"):
        with serve_app(build_app(str(spm_models[source]), **TINY_OPTIONS)) as srv:
            results[source] = [_complete(srv.url, p, s) for p in PROMPTS for s in (False, True)]
    assert results["gguf"] == results["transformers"]
    for i, prompt in enumerate(PROMPTS):
        (text, usage), (streamed, streamed_usage) = results["gguf"][2 * i : 2 * i + 2]
        ids = tok.encode(prompt)
        assert usage == streamed_usage == len(ids) and ids[0] == 1 and ids[1] != 1
        assert streamed == text
        if prompt[0].isascii() and prompt[0] != "<":
            # the completion continues the prompt's text: no lost or doubled word-start space
            prompt_text = tok.decode(ids, skip_special_tokens=True)
            assert prompt_text == prompt
            assert text == _engine_text(spm_models["gguf"], prompt)


_LLMS: dict[Path, LLM] = {}


def _llm(path: Path) -> LLM:
    if path not in _LLMS:
        _LLMS[path] = LLM(model=str(path), page_size=4, num_pages=256)
    return _LLMS[path]


def _engine_text(path: Path, prompt: str) -> str:
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    return _llm(path).generate([prompt], params, use_tqdm=False)[0].outputs[0].text


@pytest.mark.parametrize("style", ["gguf", "transformers", "legacy", "metaspace"])
def test_prompt_text_plus_completion_equals_decode_of_all(
    spm_models: dict[str, Path], style: str
) -> None:
    if style == "transformers":
        pytest.importorskip("transformers")
    llm = _llm(spm_models[style])
    tok: Any = llm.engine.tokenizer
    params = [
        SamplingParams(temperature=1.0, seed=seed, max_tokens=24, ignore_eos=True)
        for seed in range(len(PROMPTS) * 3)
    ]
    prompts = PROMPTS * 3
    outs = llm.generate(prompts, params, use_tqdm=False)
    # streamed: the engine's per-step deltas, joined
    engine = llm.engine
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(prompt, p, request_id=f"s{i}")
    streamed: dict[str, str] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            streamed[out.request_id] = streamed.get(out.request_id, "") + out.outputs[0].text
    first_spaces = 0
    for i, out in enumerate(outs):
        ids, generated = out.prompt_token_ids, list(out.outputs[0].token_ids)
        prompt_text = tok.decode(ids, skip_special_tokens=True)
        full = tok.decode(ids + generated, skip_special_tokens=True)
        assert prompt_text + out.outputs[0].text == full
        assert prompt_text + streamed[f"s{i}"] == full
        first_spaces += out.outputs[0].text.startswith(" ")
    assert first_spaces > 0  # some completions start a new word: the case that was broken


@pytest.mark.hf
@pytest.mark.parametrize("style", ["transformers", "legacy", "metaspace"])
def test_hf_folder_prompt_ids_equal_transformers_loading_that_folder(
    spm_models: dict[str, Path], style: str
) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(spm_models[style]))
    ours = load_model(spm_models[style]).tokenizer
    for text in [*SPM_STRINGS, *PROMPTS]:
        theirs = hf.encode(text)
        assert ours.encode(text) == (theirs[1:] if theirs[:2] == [1, 1] else theirs)
