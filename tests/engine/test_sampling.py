"""SamplingParams validation and the sampler's exact support / reproducibility."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedattn.engine.sampler import make_generator, sample, sample_each, sampling_probs
from pagedattn.sampling_params import SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"top_k": -2}, "top_k"),
        ({"seed": -3}, "seed"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ],
)
def test_invalid_params_raise_naming_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_valid_edge_values_and_normalisation() -> None:
    p = SamplingParams(temperature=0, top_k=-1, top_p=1.0, max_tokens=0, stop="END")
    assert p.greedy and p.stop == ("END",) and p.max_tokens == 0
    assert SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)


@given(st.lists(st.floats(-50, 50, allow_nan=False), min_size=2, max_size=40))
def test_temperature_zero_is_exact_argmax(values: list[float]) -> None:
    logits = np.asarray([values, values[::-1]], dtype=np.float32)
    p = SamplingParams(temperature=0.0)
    out = sample(logits, [p, p], [make_generator(0), make_generator(1)])
    assert out.tolist() == [int(np.argmax(logits[0])), int(np.argmax(logits[1]))]


def test_tiny_temperature_never_nan_and_picks_the_max() -> None:
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((4, 300)) * 30).astype(np.float32)
    for t in (1e-8, 1e-20, 1e-300, 5e-324):
        p = SamplingParams(temperature=t)
        probs = sampling_probs(logits[0], p)
        assert not np.isnan(probs).any()
        out = sample(logits, [p] * 4, [make_generator(i) for i in range(4)])
        assert out.tolist() == np.argmax(logits, axis=1).tolist()


def _draw(logits: np.ndarray, p: SamplingParams, n: int, seed: int) -> np.ndarray:
    gen = make_generator(seed)
    rows = np.broadcast_to(logits, (n, logits.shape[0]))
    return sample(rows, [p] * n, [gen] * n)


def test_seed_reproducible_and_seeds_differ_on_a_flat_distribution() -> None:
    flat = np.zeros(1000, dtype=np.float32)
    p = SamplingParams(temperature=1.0, seed=7)
    a = _draw(flat, p, 50, seed=7)
    b = _draw(flat, p, 50, seed=7)
    c = _draw(flat, p, 50, seed=8)
    assert a.tolist() == b.tolist()
    assert a.tolist() != c.tolist()


def test_top_k_support_is_exactly_the_k_largest() -> None:
    logits = np.log(np.asarray([0.05, 0.30, 0.10, 0.25, 0.20, 0.10], dtype=np.float64))
    logits = logits.astype(np.float32)
    draws = _draw(logits, SamplingParams(temperature=1.0, top_k=3), 4000, seed=1)
    assert set(draws.tolist()) == {1, 3, 4}
    # Renormalised frequencies: 0.30/0.75, 0.25/0.75, 0.20/0.75.
    freq = np.bincount(draws, minlength=6) / draws.size
    np.testing.assert_allclose(freq[[1, 3, 4]], [0.4, 1 / 3, 0.8 / 3], atol=0.03)


def test_top_p_support_is_the_smallest_prefix_reaching_p() -> None:
    probs = np.asarray([0.05, 0.30, 0.10, 0.25, 0.20, 0.10])
    logits = np.log(probs).astype(np.float32)
    # Sorted: 0.30, 0.25, 0.20 (cumulative 0.75), then 0.10: top_p=0.7 keeps exactly 3.
    draws = _draw(logits, SamplingParams(temperature=1.0, top_p=0.7), 4000, seed=2)
    assert set(draws.tolist()) == {1, 3, 4}
    # top_p=0.76 needs a fourth token (one of the 0.10s).
    support = np.flatnonzero(sampling_probs(logits, SamplingParams(top_p=0.76)))
    assert len(support) == 4 and {1, 3, 4} < set(support.tolist())
    # A tiny top_p keeps only the most likely token.
    assert set(_draw(logits, SamplingParams(top_p=0.01), 200, seed=3).tolist()) == {1}


def test_top_k_then_top_p_compose() -> None:
    probs = np.asarray([0.4, 0.3, 0.2, 0.1])
    p = sampling_probs(np.log(probs), SamplingParams(top_k=3, top_p=0.5))
    # top-k renormalises to 4/9, 3/9, 2/9; top_p=0.5 then keeps the first two.
    np.testing.assert_allclose(p, [4 / 7, 3 / 7, 0.0, 0.0])


def test_sample_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="num_rows, vocab"):
        sample(np.zeros(5, np.float32), [SamplingParams()], [make_generator(0)])
    with pytest.raises(ValueError, match="2 entries"):
        sample(np.zeros((2, 5), np.float32), [SamplingParams()], [make_generator(0)])


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({7: np.nan}, "NaN or +inf"),
        ({0: np.nan, 3: 9.0}, "NaN or +inf"),  # NaN before a larger logit
        ({5: np.inf}, "NaN or +inf"),
        ({i: -np.inf for i in range(10)}, "every token id is masked"),
    ],
)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_bad_row_fails_alone_and_the_others_are_sampled(
    bad: dict[int, float], message: str, temperature: float
) -> None:
    logits = np.zeros((3, 10), np.float32)
    logits[:, 4] = 5.0  # rows 0 and 2: token 4 is the argmax
    for i, v in bad.items():
        logits[1, i] = v
    params = [SamplingParams(temperature=0.0, max_tokens=1)] * 3
    params[1] = SamplingParams(temperature=temperature, max_tokens=1)
    ids, errors = sample_each(logits, params, [make_generator(0)] * 3)
    assert ids.tolist() == [4, -1, 4]
    assert list(errors) == [1] and message in errors[1]
