"""n > 1 and best_of: one prefill, forked children sharing the prompt's full pages (copy-on-write
of the partial last page), child i equal to a solo request with seed + i."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tests.engine.helpers import (
    assert_all_pages_free,
    drain,
    make_engine,
    solo,
    tiny_model,
)

from pagedattn.cache import OutOfPagesError
from pagedattn.engine.llm import merge_delta
from pagedattn.engine.outputs import RequestOutput
from pagedattn.sampling_params import SamplingParams


def _final(outs: list[RequestOutput]) -> RequestOutput:
    acc: dict[str, RequestOutput] = {}
    for o in outs:
        merge_delta(acc, o)
    return next(iter(acc.values()))


def _prompt(n: int, vocab: int) -> list[int]:
    return [(i * 7919 + 3) % (vocab - 3) + 3 for i in range(n)]


def test_n4_over_1000_tokens_shares_the_prompt_pages_and_children_equal_solo_runs() -> None:
    model = tiny_model(max_position_embeddings=2048)
    prompt = _prompt(1000, model.config.vocab_size)
    ps, pool = 16, 200
    engine = make_engine(model, page_size=ps, num_pages=pool, max_num_batched_tokens=1024)
    params = SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=8, ignore_eos=True)
    engine.add_request(prompt, params, request_id="r")
    manager = engine.cache_manager
    calls: list[int] = []
    real_forward = model.forward

    def forward(batch: Any, kv: Any) -> Any:
        calls.append(batch.num_tokens)
        return real_forward(batch, kv)

    engine.runner.model = type(
        "M", (), {"forward": staticmethod(forward), "config": model.config}
    )()
    outs = engine.step()  # the one prefill; then the fork
    full, partial = 1000 // ps, 1000 % ps
    assert calls == [1000]  # the prompt was computed once
    # 62 full pages once + the parent's partial page + 3 copies of it (one per child).
    assert pool - manager.allocator.num_free_pages == full + 4
    tables = [manager.page_table(s.seq_id) for s in engine.scheduler.running]
    assert len(tables) == 4 and partial > 0
    for t in tables:
        assert t[:full] == tables[0][:full]  # shared by reference count
        assert manager.allocator.refcount(t[0]) == 4
    assert len({t[full] for t in tables}) == 4  # each child its own last page
    assert [c.index for c in outs[0].outputs] == [0, 1, 2, 3] and not outs[0].finished
    manager.check_integrity()
    rest = drain(engine)["r"]
    final = _final(outs + rest)
    assert final.finished and [c.index for c in final.outputs] == [0, 1, 2, 3]
    assert calls[1:] == [4] * 7  # then one decode token per child per step
    assert_all_pages_free(engine)
    for i, c in enumerate(final.outputs):
        alone = SamplingParams(temperature=1.0, seed=11 + i, max_tokens=8, ignore_eos=True)
        assert c.token_ids == solo(model, prompt, alone, page_size=ps, num_pages=pool)
    assert len({tuple(c.token_ids) for c in final.outputs}) > 1


def test_deltas_list_only_changed_children_and_finished_waits_for_all() -> None:
    model = tiny_model()
    engine = make_engine(model, page_size=4, num_pages=64)
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=6, ignore_eos=True)
    outs = drain(engine, {0: [("r", [1, 5, 9, 11, 20], params)]})["r"]
    assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
    for o in outs:
        assert all(len(c.token_ids) == 1 for c in o.outputs)
    final = _final(outs)
    assert [len(c.token_ids) for c in final.outputs] == [6, 6, 6]

    # Children finishing at different steps: deltas after a child's finish omit it.
    stop_at = {}
    for i in range(3):
        alone = SamplingParams(temperature=1.0, seed=5 + i, max_tokens=6, ignore_eos=True)
        stop_at[i] = solo(model, [1, 5, 9, 11, 20], alone, page_size=4)
    token = stop_at[0][1]  # child 0 ends at its second token at the latest
    params = SamplingParams(
        n=3, temperature=1.0, seed=5, max_tokens=6, ignore_eos=True, stop_token_ids=[token]
    )
    engine = make_engine(model, page_size=4, num_pages=64)
    outs = drain(engine, {0: [("s", [1, 5, 9, 11, 20], params)]})["s"]
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
    for step, o in enumerate(outs):  # a finished child is not listed again
        assert [c.index for c in o.outputs] == [i for i in range(3) if lengths[i] > step]
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
    # The oracle: four solo requests with seeds 21..24 and logprobs, ranked by their sum.
    runs = []
    for i in range(4):
        alone = SamplingParams(
            temperature=1.0, seed=21 + i, max_tokens=5, ignore_eos=True, logprobs=0
        )
        e = make_engine(model, page_size=4, num_pages=64)
        runs.append(_final(drain(e, {0: [("x", prompt, alone)]})["x"]).outputs[0])
    best = sorted(runs, key=lambda c: -(c.cumulative_logprob or 0.0))[:2]
    assert [c.token_ids for c in got] == [c.token_ids for c in best]
    for g, b in zip(got, best, strict=True):
        assert g.cumulative_logprob == pytest.approx(b.cumulative_logprob, abs=1e-5)
    assert got[0].logprobs is None  # logprobs were not asked: used for ranking only
    assert_all_pages_free(engine)


def test_abort_and_fork_without_pages_and_preemption_keep_the_pool_consistent() -> None:
    model = tiny_model()
    # A pool so small that at the fork only two of the three children find a page for their
    # copy (the other request holds 5 of the 9 pages); the third waits and is recomputed.
    engine = make_engine(model, page_size=4, num_pages=9)
    prompt = [1, 5, 9, 11, 20, 3]  # 2 pages, the last one partial
    other = list(range(30, 50))  # 5 pages
    params = SamplingParams(n=4, temperature=1.0, seed=2, max_tokens=4, ignore_eos=True)
    greedy = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    failed = []
    real_fork = engine.cache_manager.fork

    def fork(parent: int, child: int) -> list[tuple[int, int]]:
        try:
            return real_fork(parent, child)
        except OutOfPagesError:
            failed.append(child)
            raise

    engine.cache_manager.fork = fork  # type: ignore[method-assign]
    outs = drain(engine, {0: [("r", prompt, params), ("o", other, greedy)]})
    final = _final(outs["r"])
    assert final.finished and len(final.outputs) == 4
    for i, c in enumerate(final.outputs):
        alone = SamplingParams(temperature=1.0, seed=2 + i, max_tokens=4, ignore_eos=True)
        assert c.token_ids == solo(model, prompt, alone)
    assert len(failed) == 1
    assert _final(outs["o"]).outputs[0].token_ids == solo(model, other, greedy)
    assert_all_pages_free(engine)
    engine.add_request(prompt, params, request_id="a")
    engine.step()
    assert engine.abort("a")
    (out,) = engine.step()
    assert out.finished and all(c.finish_reason == "abort" for c in out.outputs)
    assert_all_pages_free(engine)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_workload_with_forks_preemption_and_chunks_equals_solo_runs(seed: int) -> None:
    model = tiny_model()
    rng = np.random.default_rng(seed)
    vocab = model.config.vocab_size
    engine = make_engine(model, page_size=4, num_pages=12, max_num_batched_tokens=16)
    arrivals: dict[int, list[tuple[str, Any, SamplingParams]]] = {}
    requests = []
    for r in range(6):
        prompt = rng.integers(3, vocab, int(rng.integers(3, 15))).tolist()
        n = int(rng.integers(1, 4))
        params = SamplingParams(
            n=n,
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
