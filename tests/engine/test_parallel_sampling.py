"""n > 1 and best_of as child requests of a parent: child i equals a solo request with seed + i
(the oracle: the n = 1 path), children 1.. share the prompt's full pages through the prefix
cache, best_of keeps the n best by cumulative logprob, and abort / failure / preemption of a
parent reach every child."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tests.engine.helpers import assert_all_pages_free, drain, make_engine, solo, tiny_model

from pagedattn.engine.llm import merge_delta
from pagedattn.engine.outputs import RequestOutput
from pagedattn.engine.step_output import SampledToken, StepOutput
from pagedattn.sampling_params import SamplingParams


def _final(outs: list[RequestOutput]) -> RequestOutput:
    acc: dict[str, RequestOutput] = {}
    for o in outs:
        merge_delta(acc, o)
    return next(iter(acc.values()))


def _prompt(n: int, vocab: int) -> list[int]:
    return [(i * 7919 + 3) % (vocab - 3) + 3 for i in range(n)]


def _counting(engine: Any, model: Any) -> list[int]:
    """Make ``engine`` record each forward's token count; returns the list it fills."""
    calls: list[int] = []

    def forward(batch: Any, kv: Any) -> Any:
        calls.append(batch.num_tokens)
        return model.forward(batch, kv)

    engine.runner.model = type(
        "M", (), {"forward": staticmethod(forward), "config": model.config}
    )()
    return calls


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_n4_over_1000_tokens_children_hit_the_prompt_pages_and_equal_solo_runs(
    prefix_caching: bool,
) -> None:
    model = tiny_model(max_position_embeddings=2048)
    prompt = _prompt(1000, model.config.vocab_size)
    ps, pool = 16, 200
    options: dict[str, Any] = dict(
        page_size=ps, num_pages=pool, max_num_batched_tokens=4096,
        long_prefill_token_threshold=4096, enable_prefix_caching=prefix_caching,
    )  # fmt: skip
    engine = make_engine(model, **options)
    calls = _counting(engine, model)
    params = SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=8, ignore_eos=True)
    engine.add_request(prompt, params, request_id="r")
    full, partial = 1000 // ps * ps, 1000 % ps
    outs = list(engine.step())
    if prefix_caching:
        assert calls == [1000]  # child 0 alone; its siblings wait for its prompt pages
        assert [c.index for c in outs[0].outputs] == [0]
        outs += engine.step()
        assert calls[1] == 1 + 3 * partial  # child 0 decodes; 1..3 compute the partial page
        cached = {rid: n for rid, _, n in engine.kv_snapshot()["sequences"]}
        assert cached == {"0_r": 0, "1_r": full, "2_r": full, "3_r": full}
        # the prompt's full pages once + each child's own last page (as a fork held them)
        assert pool - engine.cache_manager.allocator.num_free_pages == full // ps + 4
    engine.cache_manager.check_integrity()
    final = _final(outs + drain(engine)["r"])
    # the prompt tokens computed: once + each sibling's partial page, or the whole prompt
    # per child without prefix caching; then 7 decode tokens per child
    prompt_cost = 1000 + 3 * partial if prefix_caching else 4 * 1000
    assert sum(calls) == prompt_cost + 4 * 7
    assert final.finished and [c.index for c in final.outputs] == [0, 1, 2, 3]
    assert final.num_cached_tokens == 0  # the request's prompt counted once: child 0's
    assert_all_pages_free(engine)
    for i, c in enumerate(final.outputs):
        alone = SamplingParams(temperature=1.0, seed=11 + i, max_tokens=8, ignore_eos=True)
        assert c.token_ids == solo(model, prompt, alone, page_size=ps, num_pages=pool)
    assert len({tuple(c.token_ids) for c in final.outputs}) > 1


def test_children_of_a_prompt_without_a_full_page_do_not_wait() -> None:
    engine = make_engine(tiny_model(), page_size=4, num_pages=64)
    engine.add_request([7, 8, 9], SamplingParams(n=3, max_tokens=2, seed=3), request_id="s")
    plan = engine.scheduler.schedule()
    assert [r.request_id for r in plan.requests] == ["0_s", "1_s", "2_s"]


def test_greedy_n3_gives_three_copies_of_the_n1_output() -> None:
    model = tiny_model()
    prompt = _prompt(23, model.config.vocab_size)
    greedy = SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True)
    want = solo(model, prompt, greedy)
    engine = make_engine(model, page_size=4, num_pages=64)
    params = SamplingParams(n=3, temperature=0.0, max_tokens=7, ignore_eos=True)
    final = _final(drain(engine, {0: [("g", prompt, params)]})["g"])
    assert [c.token_ids for c in final.outputs] == [want] * 3
    assert [c.index for c in final.outputs] == [0, 1, 2]
    assert_all_pages_free(engine)


def test_deltas_list_only_changed_children_and_finished_waits_for_all() -> None:
    model = tiny_model()
    prompt = [1, 5, 9, 11, 20]
    stop_at = {}
    for i in range(3):
        alone = SamplingParams(temperature=1.0, seed=5 + i, max_tokens=6, ignore_eos=True)
        stop_at[i] = solo(model, prompt, alone, page_size=4)
    token = stop_at[0][1]  # child 0 ends at its second token at the latest
    params = SamplingParams(
        n=3, temperature=1.0, seed=5, max_tokens=6, ignore_eos=True, stop_token_ids=[token]
    )
    engine = make_engine(model, page_size=4, num_pages=64)
    outs = drain(engine, {0: [("s", prompt, params)]})["s"]
    assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
    final = _final(outs)
    for i, c in enumerate(final.outputs):
        ref = stop_at[i]
        end = ref.index(token) + 1 if token in ref else len(ref)
        assert c.token_ids == ref[:end]
        assert (c.finish_reason, c.stop_reason) == (
            ("stop", token) if token in ref else ("length", None)
        )
    lengths = [len(c.token_ids) for c in final.outputs]
    assert min(lengths) < max(lengths)  # the children finish at different steps
    # child 0 samples from step 0, its siblings from step 1 (they waited for its prompt);
    # a finished child is not listed again
    for step, o in enumerate(outs):
        first = [0 if i == 0 else 1 for i in range(3)]
        want = [i for i in range(3) if first[i] <= step < first[i] + lengths[i]]
        assert [c.index for c in o.outputs] == want
        assert all(len(c.token_ids) == 1 for c in o.outputs)
    assert_all_pages_free(engine)


def test_best_of_returns_the_top_n_by_cumulative_logprob_once_all_finished() -> None:
    model = tiny_model()
    engine = make_engine(model, page_size=4, num_pages=64)
    prompt = [1, 8, 13, 2, 40, 6]
    params = SamplingParams(n=2, best_of=4, temperature=1.0, seed=21, max_tokens=5, ignore_eos=True)
    outs = drain(engine, {0: [("r", prompt, params)]})["r"]
    assert len(outs) == 1 and outs[0].finished  # nothing until all four finished
    got = outs[0].outputs
    assert [c.index for c in got] == [0, 1]
    # The oracle: four solo requests with seeds 21..24 and logprobs, ranked by the sum of
    # their own tokens' logprobs.
    runs = []
    for i in range(4):
        alone = SamplingParams(
            temperature=1.0, seed=21 + i, max_tokens=5, ignore_eos=True, logprobs=0
        )
        e = make_engine(model, page_size=4, num_pages=64)
        runs.append(_final(drain(e, {0: [("x", prompt, alone)]})["x"]).outputs[0])
    sums = [
        sum(p[t].logprob for p, t in zip(c.logprobs or [], c.token_ids, strict=True)) for c in runs
    ]
    order = sorted(range(4), key=lambda i: -sums[i])[:2]
    assert [c.token_ids for c in got] == [runs[i].token_ids for i in order]
    for g, i in zip(got, order, strict=True):
        assert g.cumulative_logprob == pytest.approx(sums[i], abs=1e-4)
    assert got[0].logprobs is None  # logprobs were not asked: used for ranking only
    assert_all_pages_free(engine)


def test_abort_of_the_parent_ends_every_child_and_preemption_keeps_answers() -> None:
    model = tiny_model()
    engine = make_engine(model, page_size=4, num_pages=9)  # small: children get preempted
    prompt = [1, 5, 9, 11, 20, 3]  # 2 pages, the last one partial
    other = list(range(30, 50))  # 5 pages
    params = SamplingParams(n=4, temperature=1.0, seed=2, max_tokens=4, ignore_eos=True)
    greedy = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    outs = drain(engine, {0: [("r", prompt, params), ("o", other, greedy)]})
    final = _final(outs["r"])
    assert final.finished and len(final.outputs) == 4
    for i, c in enumerate(final.outputs):
        alone = SamplingParams(temperature=1.0, seed=2 + i, max_tokens=4, ignore_eos=True)
        assert c.token_ids == solo(model, prompt, alone)
    assert _final(outs["o"]).outputs[0].token_ids == solo(model, other, greedy)
    assert_all_pages_free(engine)
    engine.add_request(prompt, params, request_id="a")
    engine.step()  # child 0's prefill; the others wait
    assert engine.abort("a") and not engine.abort("a")
    (out,) = engine.step()
    assert out.request_id == "a" and out.finished
    assert [c.finish_reason for c in out.outputs] == ["abort"] * 4
    assert not engine.has_unfinished_requests()
    assert_all_pages_free(engine)


def test_a_failing_child_fails_its_siblings_and_only_its_request() -> None:
    model = tiny_model()
    engine = make_engine(model, page_size=4, num_pages=64)
    run = engine.runner.run

    def failing(plan: Any) -> StepOutput:
        out = run(plan)
        if "1_f" in out.requests and out.requests["1_f"].sample is not None:
            out.requests["1_f"].sample = SampledToken(-1, error="injected: row failed")
        return out

    engine.runner.run = failing  # type: ignore[method-assign]
    params = SamplingParams(n=3, temperature=1.0, seed=4, max_tokens=6, ignore_eos=True)
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = drain(engine, {0: [("f", [4, 8, 15, 16, 23], params), ("g", [42, 7, 9], greedy)]})
    final = _final(outs["f"])
    assert final.finished and final.error == "injected: row failed"
    assert [c.finish_reason for c in final.outputs] == ["error"] * 3
    assert _final(outs["g"]).outputs[0].token_ids == solo(model, [42, 7, 9], greedy)
    assert_all_pages_free(engine)


def test_request_ids_of_a_parent_and_its_children_are_taken() -> None:
    engine = make_engine(tiny_model(), page_size=4, num_pages=64)
    params = SamplingParams(n=2, max_tokens=3, seed=1)
    engine.add_request([5, 6, 7], params, request_id="r")
    for rid in ("r", "1_r"):
        with pytest.raises(ValueError, match="already in use"):
            engine.add_request([5, 6, 7], SamplingParams(max_tokens=1), request_id=rid)
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=1), request_id="x")
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request([5, 6, 7], params, request_id="x")
    drain(engine)
    assert_all_pages_free(engine)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_workload_with_children_preemption_and_chunks_equals_solo_runs(seed: int) -> None:
    model = tiny_model()
    rng = np.random.default_rng(seed)
    vocab = model.config.vocab_size
    engine = make_engine(model, page_size=4, num_pages=12, max_num_batched_tokens=16)
    arrivals: dict[int, list[tuple[str, Any, SamplingParams]]] = {}
    requests = []
    for r in range(6):
        prompt = rng.integers(3, vocab, int(rng.integers(3, 15))).tolist()
        params = SamplingParams(
            n=int(rng.integers(1, 4)),
            temperature=1.0,
            seed=100 * r,
            max_tokens=int(rng.integers(1, 7)),
            ignore_eos=True,
            logprobs=int(rng.integers(0, 3)) if r % 2 else None,
        )
        arrivals.setdefault(int(rng.integers(0, 4)), []).append((f"r{r}", prompt, params))
        requests.append((f"r{r}", prompt, params))
    outs = drain(engine, arrivals)
    for rid, prompt, params in requests:
        final = _final(outs[rid])
        assert final.finished and [c.index for c in final.outputs] == list(range(params.n))
        for i, c in enumerate(final.outputs):
            alone = SamplingParams(
                temperature=1.0,
                seed=params.seed + i,  # type: ignore[operator]
                max_tokens=params.max_tokens,
                ignore_eos=True,
            )
            assert c.token_ids == solo(model, prompt, alone)
            assert c.logprobs is None or len(c.logprobs) == len(c.token_ids)
    assert engine.scheduler.stats.num_preemptions > 0  # the pool is small enough to preempt
    assert_all_pages_free(engine)
