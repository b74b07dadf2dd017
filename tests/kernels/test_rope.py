"""RoPE: equals transformers' rotate-half implementation; rotations compose; bad input refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedattn.kernels.rope import apply_rope, apply_rope_cos_sin, rope_cos_sin


def test_matches_hf_apply_rotary_pos_emb() -> None:
    torch = pytest.importorskip("torch")
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, 3, 64)).astype(np.float32)
    positions = np.array([0, 1, 2, 15, 16, 100, 4000])
    cos, sin = rope_cos_sin(positions, 64, 100000.0)
    full_cos = torch.from_numpy(np.concatenate([cos, cos], 1))[None]  # (1, T, D)
    full_sin = torch.from_numpy(np.concatenate([sin, sin], 1))[None]
    xt = torch.from_numpy(x).transpose(0, 1)[None]  # (1, H, T, D) as HF
    want, _ = llama.apply_rotary_pos_emb(xt, xt, full_cos, full_sin)
    np.testing.assert_allclose(
        apply_rope(x, positions, 100000.0), want[0].transpose(0, 1).numpy(), rtol=0, atol=1e-6
    )


def test_position_zero_is_identity_and_known_angle() -> None:
    x = np.zeros((2, 1, 4), np.float32)
    x[:, 0, 0] = 1.0  # unit vector in the first half's dim 0 (inv_freq 1)
    out = apply_rope(x, np.array([0, 1]), 10000.0)
    np.testing.assert_array_equal(out[0], x[0])
    np.testing.assert_allclose(out[1, 0], [np.cos(1.0), 0.0, np.sin(1.0), 0.0], atol=1e-7)


@given(
    p=st.integers(-(2**20), 2**20),
    d=st.integers(-(2**12), 2**12),
    seed=st.integers(0, 2**16),
)
def test_rotations_compose(p: int, d: int, seed: int) -> None:
    x = np.random.default_rng(seed).standard_normal((1, 2, 8)).astype(np.float32)
    once = apply_rope(x, np.array([p + d]), 10000.0)
    twice = apply_rope(apply_rope(x, np.array([p]), 10000.0), np.array([d]), 10000.0)
    np.testing.assert_allclose(once, twice, atol=2e-4)
    np.testing.assert_allclose(np.linalg.norm(once), np.linalg.norm(x), rtol=1e-5)


def test_large_positions_use_float64_angles() -> None:
    cos, sin = rope_cos_sin(np.array([10_000_000]), 2, 10000.0)
    assert cos.dtype == np.float32
    assert cos[0, 0] == np.float32(np.cos(10_000_000.0))
    assert sin[0, 0] == np.float32(np.sin(10_000_000.0))


def test_bad_input_is_refused() -> None:
    x = np.zeros((3, 2, 8), np.float32)
    with pytest.raises(ValueError, match=r"positions: expected shape \(3,\)"):
        apply_rope(x, np.arange(4), 10000.0)
    with pytest.raises(ValueError, match="head_dim must be a positive even int"):
        rope_cos_sin(np.arange(3), 7, 10000.0)
    with pytest.raises(ValueError, match=r"cos/sin: expected shape \(3, 4\)"):
        apply_rope_cos_sin(x, np.zeros((3, 8), np.float32), np.zeros((3, 8), np.float32))
    with pytest.raises(ValueError, match="theta must be positive"):
        rope_cos_sin(np.arange(3), 8, 0.0)
