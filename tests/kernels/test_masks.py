"""Masks: visible_mask against an independent double loop, and the W=4 window counts."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.kernels import (
    paged_attention_decode,
    paged_attention_prefill,
    reference_attention,
    visible_mask,
)
from tests.kernels.helpers import randn, scatter_sequences


def brute_mask(q_len: int, k_len: int, window: int | None, sinks: int) -> np.ndarray:
    mask = np.zeros((q_len, k_len), dtype=bool)
    for i in range(q_len):
        p = k_len - q_len + i
        for j in range(k_len):
            in_window = window is None or j > p - window or j < sinks
            mask[i, j] = j <= p and in_window
    return mask


@pytest.mark.parametrize(
    ("window", "sinks"), [(None, 0), (None, 2), (1, 0), (3, 0), (4, 2), (7, 5)]
)
def test_visible_mask_matches_double_loop(window: int | None, sinks: int) -> None:
    for k_len in range(1, 17):
        for q_len in range(1, k_len + 1):
            got = visible_mask(q_len, k_len, sliding_window=window, num_sink_tokens=sinks)
            np.testing.assert_array_equal(got, brute_mask(q_len, k_len, window, sinks))


def test_window_4_over_10_tokens_counts() -> None:
    expected = [1, 2, 3, 4, 4, 4, 4, 4, 4, 4]
    assert visible_mask(10, 10, sliding_window=4).sum(axis=1).tolist() == expected
    for step in range(1, 11):  # each decode step: one row at position step - 1
        assert visible_mask(1, step, sliding_window=4).sum() == expected[step - 1]


def test_window_4_kernel_counts_via_lse() -> None:
    # q = 0 makes every score 0, so lse = log(number of visible keys) exactly.
    rng = np.random.default_rng(1)
    expected = np.array([1, 2, 3, 4, 4, 4, 4, 4, 4, 4], np.float32)
    k, v = randn(rng, 10, 1, 8), randn(rng, 10, 1, 8)
    kc, vc, tables = scatter_sequences([k], [v], 3, rng)
    q = np.zeros((10, 2, 8), np.float32)
    qsl = np.array([0, 10], np.int32)
    _, lse = paged_attention_prefill(
        q, kc, vc, tables, qsl, np.array([10], np.int32), sliding_window=4, return_lse=True
    )
    np.testing.assert_allclose(np.exp(lse), np.repeat(expected[:, None], 2, 1), rtol=1e-6)
    _, ref_lse = reference_attention(q, k, v, sliding_window=4, return_lse=True)
    np.testing.assert_allclose(np.exp(ref_lse), np.repeat(expected[:, None], 2, 1), rtol=1e-6)
    for step in range(1, 11):
        _, lse = paged_attention_decode(
            q[:1], kc, vc, tables, np.array([step], np.int32), sliding_window=4, return_lse=True
        )
        np.testing.assert_allclose(np.exp(lse), expected[step - 1], rtol=1e-6)


def test_window_4_kernel_mean_of_visible_keys() -> None:
    # V of key j is j: with uniform scores the output is the mean of the visible positions.
    rng = np.random.default_rng(2)
    k = randn(rng, 10, 1, 4)
    v = np.repeat(np.arange(10, dtype=np.float32)[:, None, None], 4, axis=2)
    kc, vc, tables = scatter_sequences([k], [v], 4, rng)
    q = np.zeros((10, 1, 4), np.float32)
    out = paged_attention_prefill(
        q, kc, vc, tables, np.array([0, 10], np.int32), np.array([10], np.int32), sliding_window=4
    )
    expected = [np.mean(np.arange(max(0, p - 3), p + 1)) for p in range(10)]
    np.testing.assert_allclose(out[:, 0, 0], expected, rtol=1e-6)
