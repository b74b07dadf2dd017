"""Speculative decoding over HTTP: on by default, the per-request ``speculative: false`` opt-out
drafts nothing, and either way the reply is the in-process engine's without speculation (the
oracle: ``LLM(..., speculative="none")``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pagedattn.engine.llm import LLM
from pagedattn.sampling_params import SamplingParams
from tests.server.conftest import TINY_OPTIONS, RunningServer, ServerFactory

PROMPT = "abc abc abc abc abc abc abc"
DRAFTED = "pagedattn:spec_decode_num_draft_tokens_total"


@pytest.fixture(scope="module")
def own_server(make_server: ServerFactory) -> Iterator[RunningServer]:
    with make_server() as srv:  # the default engine options: speculation on
        yield srv


def _complete(srv: RunningServer, **body: Any) -> tuple[str, float]:
    """The reply's text and how many tokens the server drafted for it."""
    before = srv.metrics()[DRAFTED]
    base = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"{srv.url}/v1/completions", json={**base, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"]), srv.wait_idle()[DRAFTED] - before


def test_opt_out_drafts_nothing_and_both_equal_plain_decoding(
    own_server: RunningServer, tiny_model_dir: Path
) -> None:
    plain = LLM(str(tiny_model_dir), speculative="none", **TINY_OPTIONS)
    extras: list[dict[str, Any]] = [{}, {"temperature": 0.9, "seed": 3}]
    for extra in extras:
        params = SamplingParams(max_tokens=24, ignore_eos=True, **({"temperature": 0.0} | extra))
        want = plain.generate([PROMPT], params)[0].outputs[0].text
        on, drafted_on = _complete(own_server, **extra)
        off, drafted_off = _complete(own_server, speculative=False, **extra)
        assert on == off == want
        assert drafted_off == 0
        if not extra:
            assert drafted_on > 0  # the repeated prompt is drafted from by default


def test_speculative_must_be_a_bool(own_server: RunningServer) -> None:
    body = {"prompt": PROMPT, "max_tokens": 2, "speculative": "no"}
    r = httpx.post(f"{own_server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "speculative"
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "speculative": 1}
    r = httpx.post(f"{own_server.url}/v1/chat/completions", json=chat, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "speculative"
