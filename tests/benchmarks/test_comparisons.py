"""The named same-run comparisons: ratios and verdicts from one run's per-side results, and
each side's fidelity to HF."""

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


def test_generate_comparisons_ratios_and_verdicts() -> None:
    results = {
        "ours": {"decode_tok_s": 30.0, "prefill_tok_s": 900.0, "peak_rss_minus_kv_mib": 380.0},
        "hf": {"decode_tok_s": 16.0, "prefill_tok_s": 500.0, "peak_rss_mib": 1100.0},
        "llamacpp": {"decode_tok_s": 75.0, "prefill_tok_s": 240.0, "peak_rss_minus_kv_mib": 200.0},
    }
    rows = evaluate(GENERATE_COMPARISONS, results)
    by_label = {(r.comparison.label, r.comparison.goal): r for r in rows}
    decode = by_label[("single-stream decode tok/s", 1.0)]
    assert decode.ratio == pytest.approx(0.4) and decode.verdict == "NOT met"  # 30 / 75
    prefill = {r.comparison.peer: r for r in rows if r.comparison.label == "prefill tok/s"}
    assert prefill["hf"].ratio == pytest.approx(1.8) and prefill["hf"].verdict == "met"  # 900/500
    assert prefill["llamacpp"].ratio == pytest.approx(3.75)  # 900 / 240
    rss = by_label[("peak RSS minus KV cache", 1.5)]
    assert rss.ratio == pytest.approx(1.9) and rss.verdict == "NOT met"  # 380 / 200 > 1.5


def test_absent_peer_is_not_measured_never_a_number() -> None:
    rows = evaluate(
        GENERATE_COMPARISONS[:3], {"ours": {"decode_tok_s": 30.0, "prefill_tok_s": 9.0}}
    )
    assert [r.verdict for r in rows] == ["not measured: llama.cpp did not run"] * 2 + [
        "not measured: HF transformers did not run"
    ]
    assert all(r.ratio is None for r in rows)


def test_engine_comparisons_read_nested_figures_and_lower_is_better() -> None:
    results = {
        "ours": {"main": {"generated_tok_s": 150.0}},
        "hf": {"main": {"generated_tok_s": 52.0}},
    }
    batched = evaluate(ENGINE_COMPARISONS, results)
    assert batched[0].ratio == pytest.approx(150 / 52) and batched[0].verdict == "NOT met"
    assert batched[1].verdict == "not measured: llama.cpp (llama-batched-bench) did not run"
    results["llamacpp_batched"] = {"main": {"generated_tok_s": 66.8}}
    measured = evaluate(ENGINE_COMPARISONS, results)[1]
    assert measured.ratio == pytest.approx(150 / 66.8) and measured.verdict == "met"
    memory = Comparison("rss", "peak_rss_mib", "llamacpp", 2.0, lower_is_better=True)
    ok, bad = (
        evaluate([memory], {"ours": {"peak_rss_mib": m}, "llamacpp": {"peak_rss_mib": 225.0}})[0]
        for m in (450.0, 451.0)
    )
    assert (ok.verdict, bad.verdict) == ("met", "NOT met")  # 450 / 225 = 2.0 exactly


def test_unknown_peer_is_refused_and_table_prints_every_comparison() -> None:
    with pytest.raises(ValueError, match="comparison peer: expected one of"):
        evaluate([Comparison("x", "k", "vllm", 1.0)], {})
    out = io.StringIO()
    print_comparisons(
        Console(file=out, width=200), GENERATE_COMPARISONS, {"ours": {"decode_tok_s": 1.0}}
    )
    text = out.getvalue()
    assert text.count("not measured") == len(GENERATE_COMPARISONS)
    assert ">= 1.5x" in text and "<= 1.5x" in text
    assert "prefill tok/s vs llama.cpp" in text
    assert "single-stream decode tok/s vs llama.cpp" in text and "prefill tok/s vs HF" in text


def test_fidelity_compares_shared_top_tokens_and_greedy_prefix() -> None:
    ref = {"first_logprobs": {"5": -0.5, "7": -1.5, "9": -3.0}, "greedy_ids": [5, 1, 2, 3]}
    side = {"first_logprobs": {"5": -0.6, "7": -1.2, "8": -2.0}, "greedy_ids": [5, 1, 4, 3]}
    f = fidelity(side, ref)
    assert f is not None
    assert f.max_logprob_diff == pytest.approx(0.3)  # token 7: |-1.2 - -1.5|; 9 not shared
    assert (f.compared, f.same_argmax, f.greedy_prefix, f.greedy_len) == (2, True, 2, 4)
    assert fidelity({"first_logprobs": {}}, ref) is None  # a side without the figures
