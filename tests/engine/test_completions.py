"""n / best_of completions as a user sees them, whatever the mechanism behind them: the
oracle for completion i is a separate single request with seed + i (vLLM's rule), and greedy
completions equal the single greedy request."""

from __future__ import annotations

from tests.engine.helpers import assert_all_pages_free, drain, make_engine, tiny_model

from pagedattn.engine.llm import merge_delta
from pagedattn.engine.outputs import RequestOutput
from pagedattn.sampling_params import SamplingParams

PROMPT = [7, 3, 19, 4, 11, 8, 23, 5, 16, 9]  # 10 tokens: two full pages of 4 and a partial one


def _final(outs: list[RequestOutput]) -> RequestOutput:
    acc: dict[str, RequestOutput] = {}
    for o in outs:
        merge_delta(acc, o)
    return next(iter(acc.values()))


def _alone(params: SamplingParams) -> RequestOutput:
    engine = make_engine(tiny_model(), page_size=4, num_pages=64)
    return _final(drain(engine, {0: [("one", PROMPT, params)]})["one"])


def test_greedy_completions_equal_each_other_and_the_single_request() -> None:
    engine = make_engine(tiny_model(), page_size=4, num_pages=64)
    params = SamplingParams(n=2, temperature=0.0, max_tokens=6, ignore_eos=True)
    final = _final(drain(engine, {0: [("r", PROMPT, params)]})["r"])
    single = _alone(SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    assert [c.index for c in final.outputs] == [0, 1]
    assert final.outputs[0].token_ids == final.outputs[1].token_ids
    assert final.outputs[0].token_ids == single.outputs[0].token_ids
    assert_all_pages_free(engine)


def test_seeded_completion_i_equals_a_single_request_with_seed_plus_i() -> None:
    engine = make_engine(tiny_model(), page_size=4, num_pages=64)
    params = SamplingParams(
        n=3, temperature=0.9, seed=41, max_tokens=5, ignore_eos=True, logprobs=2,
        prompt_logprobs=1,
    )  # fmt: skip
    final = _final(drain(engine, {0: [("r", PROMPT, params)]})["r"])
    assert [c.index for c in final.outputs] == [0, 1, 2]
    for i, c in enumerate(final.outputs):
        single = SamplingParams(
            temperature=0.9, seed=41 + i, max_tokens=5, ignore_eos=True, logprobs=2,
            prompt_logprobs=1,
        )  # fmt: skip
        one = _alone(single)
        assert c.token_ids == one.outputs[0].token_ids
        assert c.cumulative_logprob == one.outputs[0].cumulative_logprob
        assert c.logprobs == one.outputs[0].logprobs
        if i == 0:
            assert final.prompt_logprobs == one.prompt_logprobs
    assert_all_pages_free(engine)
