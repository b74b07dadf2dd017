"""Issue 13's target table: ratios and verdicts from one run's per-side results."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from pagedattn.bench.targets import (
    ENGINE_TARGETS,
    GENERATE_TARGETS,
    Target,
    evaluate,
    print_targets,
)


def test_generate_targets_ratios_and_verdicts() -> None:
    results = {
        "ours": {"decode_tok_s": 30.0, "prefill_tok_s": 900.0, "peak_rss_mib": 400.0},
        "hf": {"decode_tok_s": 16.0, "prefill_tok_s": 500.0, "peak_rss_mib": 1100.0},
        "llamacpp": {"decode_tok_s": 75.0, "prefill_tok_s": 240.0, "peak_rss_mib": 225.0},
    }
    rows = evaluate(GENERATE_TARGETS, results)
    by_label = {(r.target.label, r.target.goal): r for r in rows}
    decode = by_label[("single-stream decode tok/s", 1.0)]
    assert decode.ratio == pytest.approx(0.4) and decode.verdict == "NOT met"  # 30 / 75
    prefill = by_label[("prefill tok/s", 1.5)]
    assert prefill.ratio == pytest.approx(1.8) and prefill.verdict == "met"  # 900 / 500
    rss = by_label[("peak RSS minus KV pool", 2.0)]
    assert rss.ratio is None and rss.verdict.startswith("not measured: neither side")


def test_absent_peer_is_not_measured_never_a_number() -> None:
    rows = evaluate(GENERATE_TARGETS[:3], {"ours": {"decode_tok_s": 30.0, "prefill_tok_s": 9.0}})
    assert [r.verdict for r in rows] == ["not measured: llama.cpp did not run"] * 2 + [
        "not measured: HF transformers did not run"
    ]
    assert all(r.ratio is None for r in rows)


def test_engine_targets_read_nested_figures_and_lower_is_better() -> None:
    results = {
        "ours": {"main": {"generated_tok_s": 150.0}},
        "hf": {"main": {"generated_tok_s": 52.0}},
    }
    batched = evaluate(ENGINE_TARGETS, results)
    assert batched[0].ratio == pytest.approx(150 / 52) and batched[0].verdict == "NOT met"
    assert batched[1].verdict == "not measured: llama.cpp (llama-batched-bench) did not run"
    results["llamacpp_batched"] = {"main": {"generated_tok_s": 66.8}}
    measured = evaluate(ENGINE_TARGETS, results)[1]
    assert measured.ratio == pytest.approx(150 / 66.8) and measured.verdict == "met"
    memory = Target("rss", "peak_rss_mib", "llamacpp", 2.0, lower_is_better=True)
    ok, bad = (
        evaluate([memory], {"ours": {"peak_rss_mib": m}, "llamacpp": {"peak_rss_mib": 225.0}})[0]
        for m in (450.0, 451.0)
    )
    assert (ok.verdict, bad.verdict) == ("met", "NOT met")  # 450 / 225 = 2.0 exactly


def test_unknown_peer_is_refused_and_table_prints_every_target() -> None:
    with pytest.raises(ValueError, match="target peer: expected one of"):
        evaluate([Target("x", "k", "vllm", 1.0)], {})
    out = io.StringIO()
    print_targets(Console(file=out, width=200), GENERATE_TARGETS, {"ours": {"decode_tok_s": 1.0}})
    text = out.getvalue()
    assert text.count("not measured") == len(GENERATE_TARGETS)
    assert ">= 1.5x" in text and "<= 2.0x" in text
