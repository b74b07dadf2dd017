"""What the hybrid KV cache reports on the tiny Gemma 3 of :mod:`tests.model.test_hybrid_kv`:
each layer group's pages in ``get_stats()``, ``/metrics``, ``/v1/kv/state`` and
``generate --stats``, against figures worked out by hand."""

from __future__ import annotations

import re
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from typer.testing import CliRunner

import pagedattn.cli.generate  # noqa: F401  (registers the command)
from pagedattn.cli.app import app
from pagedattn.sampling_params import SamplingParams
from pagedattn.server.kv_history import CounterHistory
from pagedattn.server.kv_state import build_state
from pagedattn.server.metrics import EngineStatsCollector
from tests.model.families import WINDOW
from tests.model.test_hybrid_kv import PS, _llm, _prompt, gemma

__all__ = ["gemma"]  # the module fixture, shared


def _page_layer_bytes() -> int:
    return 2 * 2 * PS * 16 * 4  # K and V, 2 KV heads, 4 tokens of head_dim 16, float32


def test_stats_and_metrics_report_each_group(gemma: dict[str, Any]) -> None:
    with _llm(gemma, long_prefill_token_threshold=2) as llm:  # prompt chunks of 2 tokens
        engine = llm.engine
        engine.add_request(_prompt(14, 30), SamplingParams(max_tokens=30, ignore_eos=True))
        for _ in range(20):
            engine.step()
        stats = engine.get_stats()
        groups = {g["name"]: g for g in stats["kv_groups"]}
        assert set(groups) == {"full", f"sliding_{WINDOW}"}
        # 20 steps: the prompt in 15 chunks of 2, then 5 decode steps: 34 tokens written
        # after the last step's reservation (positions 0..34) -> 9 pages of the full group;
        # the sliding group holds pages (34 - 7) // 4 = 6 .. 8.
        assert groups["full"]["resident_pages"] == 9
        assert groups["full"]["resident_bytes"] == 9 * _page_layer_bytes()
        assert groups[f"sliding_{WINDOW}"]["resident_pages"] == 3
        assert groups[f"sliding_{WINDOW}"]["resident_bytes"] == 3 * 5 * _page_layer_bytes()
        state = build_state(
            engine.kv_snapshot(), 0.0, "gemma", CounterHistory(engine.get_stats),
            max_cells=4096, max_requests=8, max_pages_per_request=64,
        )  # fmt: skip
        assert [(g.id, g.first_layer, g.num_layers, g.counts.used) for g in state.groups] == [
            (0, 5, 1, 9),
            (1, 0, 5, 3),
        ]
        assert [g.bytes_per_page for g in state.groups] == [
            _page_layer_bytes(),
            5 * _page_layer_bytes(),
        ]
        (request,) = state.requests
        assert [t.states for t in request.tables] == ["u" * 9, "-" * 6 + "u" * 3]
        registry = CollectorRegistry()
        registry.register(EngineStatsCollector(engine.get_stats, "gemma"))
        text = generate_latest(registry).decode()
        assert 'pagedattn:kv_group_resident_pages{group="full",model_name="gemma"} 9.0' in text
        assert (
            f'pagedattn:kv_group_resident_bytes{{group="sliding_{WINDOW}",model_name="gemma"}} '
            f"{3 * 5 * _page_layer_bytes()}.0"
        ) in text


@pytest.mark.parametrize("disable", [False, True])
def test_generate_stats_prints_kv_resident_peak_per_group(
    gemma: dict[str, Any], disable: bool
) -> None:
    args = ["generate", "the cat sat on the mat and then", "--raw", "-m", gemma["folder"],
            "--max-tokens", "30", "--ignore-eos", "--stats", "--page-size", str(PS)]  # fmt: skip
    if disable:
        args.append("--disable-hybrid-kv-cache-manager")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.stderr
    err = result.stderr
    found = re.search(r"cached prompt tokens: 0 of (\d+)", err)
    assert found, err
    n = int(found.group(1))
    full_pages = -(-(n + 30 - 1) // PS)  # the last token's KV is never written
    mib = _page_layer_bytes() / 2**20
    if disable:
        assert f"kv resident (peak) full: {full_pages * 6 * mib:.2f} MiB" in err, err
        assert "sliding" not in err
    else:
        # the whole prompt is one chunk (its first query sees position 0), then decode steps
        # hold at most 3 pages of the window of 8
        sliding_pages = max(-(-n // PS), 3)
        assert f"kv resident (peak) full: {full_pages * mib:.2f} MiB" in err, err
        assert f"kv resident (peak) sliding_{WINDOW}: {sliding_pages * 5 * mib:.2f} MiB" in err
