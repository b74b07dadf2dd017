"""The named same-run comparisons: ratios from one run's per-side results, and each side's
fidelity to HF."""

from __future__ import annotations

import io

import pytest
from benchmarks.comparisons import (
    ENGINE_COMPARISONS,
    GENERATE_COMPARISONS,
    Comparison,
    evaluate,
    print_comparisons,
)
from benchmarks.fidelity import fidelity
from rich.console import Console


def test_generate_comparisons_ratios() -> None:
    results = {
        "ours": {"decode_tok_s": 30.0, "prefill_tok_s": 900.0, "peak_rss_minus_kv_mib": 380.0},
        "hf": {"decode_tok_s": 16.0, "prefill_tok_s": 500.0, "peak_rss_mib": 1100.0},
        "llamacpp": {"decode_tok_s": 75.0, "prefill_tok_s": 240.0, "peak_rss_minus_kv_mib": 200.0},
    }
    rows = evaluate(GENERATE_COMPARISONS, results)
    by_name = {r.comparison.name: r for r in rows}
    assert by_name["single-stream decode tok/s vs llama.cpp"].ratio == pytest.approx(0.4)
    assert by_name["prefill tok/s vs HF transformers"].ratio == pytest.approx(1.8)  # 900 / 500
    assert by_name["prefill tok/s vs llama.cpp"].ratio == pytest.approx(3.75)  # 900 / 240
    assert by_name["peak RSS minus KV cache vs llama.cpp"].ratio == pytest.approx(1.9)
    assert all(r.note == "" for r in rows)


def test_absent_peer_is_not_measured_never_a_number() -> None:
    rows = evaluate(
        GENERATE_COMPARISONS[:3], {"ours": {"decode_tok_s": 30.0, "prefill_tok_s": 9.0}}
    )
    assert [r.note for r in rows] == [
        "not measured: llama.cpp did not run",
        "not measured: HF transformers did not run",
        "not measured: llama.cpp did not run",
    ]
    assert all(r.ratio is None for r in rows)


def test_engine_comparisons_read_nested_figures() -> None:
    results = {
        "ours": {"main": {"generated_tok_s": 150.0}},
        "hf": {"main": {"generated_tok_s": 52.0}},
    }
    batched = evaluate(ENGINE_COMPARISONS, results)
    assert batched[0].ratio == pytest.approx(150 / 52)
    assert batched[1].note == "not measured: llama.cpp (llama-batched-bench) did not run"
    results["llamacpp_batched"] = {"main": {"generated_tok_s": 66.8}}
    measured = evaluate(ENGINE_COMPARISONS, results)[1]
    assert measured.ratio == pytest.approx(150 / 66.8) and measured.note == ""


def test_unknown_peer_is_refused_and_table_prints_every_comparison() -> None:
    with pytest.raises(ValueError, match="comparison peer: expected one of"):
        evaluate([Comparison("x", "k", "vllm")], {})
    out = io.StringIO()
    results = {"ours": {"decode_tok_s": 1.0}, "llamacpp": {"decode_tok_s": 4.0}}
    print_comparisons(Console(file=out, width=200), GENERATE_COMPARISONS, results)
    text = out.getvalue()
    assert text.count("not measured") == len(GENERATE_COMPARISONS) - 1
    assert "0.25x" in text  # 1 / 4
    assert "prefill tok/s vs llama.cpp" in text
    assert "single-stream decode tok/s vs llama.cpp" in text and "prefill tok/s vs HF" in text
    assert "met" not in text and "goal" not in text


def test_fidelity_compares_shared_top_tokens_and_greedy_prefix() -> None:
    ref = {"first_logprobs": {"5": -0.5, "7": -1.5, "9": -3.0}, "greedy_ids": [5, 1, 2, 3]}
    side = {"first_logprobs": {"5": -0.6, "7": -1.2, "8": -2.0}, "greedy_ids": [5, 1, 4, 3]}
    f = fidelity(side, ref)
    assert f is not None
    assert f.max_logprob_diff == pytest.approx(0.3)  # token 7: |-1.2 - -1.5|; 9 not shared
    assert (f.compared, f.same_argmax, f.greedy_prefix, f.greedy_len) == (2, True, 2, 4)
    assert fidelity({"first_logprobs": {}}, ref) is None  # a side without the figures
