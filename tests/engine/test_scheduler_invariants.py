"""Hypothesis: random arrivals, aborts, budgets and tiny pools. Every step keeps the cache
consistent; every request that runs to the end equals its solo greedy run; nothing leaks."""

from __future__ import annotations

from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.engine.helpers import assert_all_pages_free, make_engine, solo, tiny_model

from pagedattn.sampling_params import SamplingParams

MODEL = tiny_model(seed=8)
MAX_TOKENS = 8


@cache
def _solo(prompt: tuple[int, ...], window: tuple[int, int] | None) -> list[int]:
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    if window is None:
        return solo(MODEL, list(prompt), params)
    return solo(MODEL, list(prompt), params, sliding_window=window[0], num_sink_tokens=window[1])


request = st.tuples(
    st.lists(st.integers(3, 40), min_size=1, max_size=20),  # prompt (small alphabet: shared
    st.integers(1, MAX_TOKENS),  # max_tokens                  prefixes happen)
    st.integers(0, 6),  # arrival step
    st.one_of(st.none(), st.integers(0, 12)),  # abort step
)


@settings(max_examples=25)
@given(
    requests=st.lists(request, min_size=1, max_size=5),
    num_pages=st.integers(4, 14),
    budget=st.integers(2, 24),
    chunked=st.booleans(),
    prefix_caching=st.booleans(),
    window=st.sampled_from([None, (4, 0), (6, 2)]),
)
def test_random_workloads_keep_invariants(
    requests: list[tuple[list[int], int, int, int | None]],
    num_pages: int,
    budget: int,
    chunked: bool,
    prefix_caching: bool,
    window: tuple[int, int] | None,
) -> None:
    window_kwargs = {} if window is None else {"sliding_window": window[0]}
    if window is not None:
        window_kwargs["num_sink_tokens"] = window[1]
    engine = make_engine(
        MODEL,
        page_size=4,
        num_pages=num_pages,
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=prefix_caching,
        max_num_seqs=3,
        **window_kwargs,
    )
    got: dict[str, list[int]] = {}
    reasons: dict[str, str | None] = {}
    step = 0
    while step <= 6 or engine.has_unfinished_requests():
        for i, (prompt, max_tokens, arrive, abort) in enumerate(requests):
            params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
            if arrive == step:
                engine.add_request(prompt, params, request_id=f"r{i}")
                got[f"r{i}"] = []
            if abort is not None and arrive + abort == step:
                engine.abort(f"r{i}")
        for out in engine.step():
            got[out.request_id] += out.outputs[0].token_ids
            if out.finished:
                reasons[out.request_id] = out.outputs[0].finish_reason
        engine.cache_manager.check_integrity()
        step += 1
        assert step < 500, "no progress"
    assert set(reasons) == set(got)
    for i, (prompt, max_tokens, _, _) in enumerate(requests):
        rid = f"r{i}"
        if reasons[rid] == "length":
            assert got[rid] == _solo(tuple(prompt), window)[:max_tokens], rid
        elif reasons[rid] == "abort":
            assert got[rid] == _solo(tuple(prompt), window)[: len(got[rid])], rid
        else:
            need = engine.scheduler.max_pages_per_seq(len(prompt), max_tokens)
            too_long = not chunked and len(prompt) > budget
            assert too_long or need > num_pages, (rid, reasons[rid])
    assert_all_pages_free(engine)
