"""KVStream: exact resident pages under LRU and window/sink eviction; output equals the oracle."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.cache import OutOfPagesError
from pagedattn.kernels import reference_attention
from pagedattn.stream.kv_stream import KVStream

H, HKV, D = 4, 2, 8


def _token(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        rng.standard_normal((H, D), dtype=np.float32),
        rng.standard_normal((HKV, D), dtype=np.float32),
        rng.standard_normal((HKV, D), dtype=np.float32),
    )


def test_lru_without_window_keeps_newest_pages() -> None:
    s = KVStream(H, HKV, D, page_size=4, max_pages=3, sliding_window=None, eviction="evict_idle")
    rng = np.random.default_rng(0)
    for _ in range(20):
        s.step(*_token(rng))
    # pages 0,1,2 took tokens 0..11; page 0 (0..3) then page 1 (4..7) were evicted and reused
    assert s.resident_pages() == [(2, 8, 11), (0, 12, 15), (1, 16, 19)]
    assert s.page_table == [-1, -1, 2, 0, 1]
    assert s.pages_evicted == 2
    assert s.manager.evictions == {"lru": 0, "sliding_window": 0, "lossy": 2}
    assert s.tokens_attended == 12 and s.max_pages_resident == 3


def test_lru_raise_policy_stops_at_capacity() -> None:
    s = KVStream(H, HKV, D, page_size=4, max_pages=2, sliding_window=None, eviction="raise")
    rng = np.random.default_rng(0)
    for _ in range(8):
        s.step(*_token(rng))
    with pytest.raises(OutOfPagesError):
        s.step(*_token(rng))


def _window_trace(sinks: int) -> tuple[list[list[tuple[int, int, int]]], list[int]]:
    s = KVStream(H, HKV, D, page_size=4, max_pages=8, sliding_window=8, num_sink_tokens=sinks)
    rng = np.random.default_rng(1)
    trace, evicted = [], []
    for _ in range(20):
        s.step(*_token(rng))
        trace.append(s.resident_pages())
        evicted.append(s.pages_evicted)
    return trace, evicted


def test_sliding_window_returns_pages_exactly_when_they_leave() -> None:
    trace, evicted = _window_trace(sinks=0)
    # W=8: query p sees p-7..p; page i (4i..4i+3) leaves at p = 4i + 11
    expected: dict[int, list[tuple[int, int, int]]] = {
        0: [(0, 0, 0)],
        3: [(0, 0, 3)],
        4: [(0, 0, 3), (1, 4, 4)],
        10: [(0, 0, 3), (1, 4, 7), (2, 8, 10)],
        11: [(1, 4, 7), (2, 8, 11)],  # page 0 returned
        12: [(1, 4, 7), (2, 8, 11), (0, 12, 12)],  # the returned page is reused at once
        14: [(1, 4, 7), (2, 8, 11), (0, 12, 14)],
        15: [(2, 8, 11), (0, 12, 15)],  # page 1 returned
        16: [(2, 8, 11), (0, 12, 15), (1, 16, 16)],
        19: [(0, 12, 15), (1, 16, 19)],  # page 2 returned
    }
    for p, pages in expected.items():
        assert trace[p] == pages, p
    assert max(len(t) for t in trace) == 3  # ceil(8 / 4) + 1
    assert evicted == [0] * 11 + [1] * 4 + [2] * 4 + [3]


def test_sinks_keep_page_zero() -> None:
    trace, evicted = _window_trace(sinks=2)
    assert trace[11] == [(0, 0, 3), (1, 4, 7), (2, 8, 11)]
    assert trace[12] == [(0, 0, 3), (1, 4, 7), (2, 8, 11), (3, 12, 12)]
    assert trace[15] == [(0, 0, 3), (2, 8, 11), (3, 12, 15)]  # page 1 returned
    assert trace[16] == [(0, 0, 3), (2, 8, 11), (3, 12, 15), (1, 16, 16)]
    assert trace[19] == [(0, 0, 3), (3, 12, 15), (1, 16, 19)]
    assert evicted[-1] == 2


def test_window_and_sinks_bound_memory_over_1000_tokens() -> None:
    s = KVStream(2, 1, 4, page_size=16, max_pages=8, sliding_window=32, num_sink_tokens=4)
    rng = np.random.default_rng(2)
    resident = []
    for _ in range(1000):
        q = rng.standard_normal((2, 4), dtype=np.float32)
        k = rng.standard_normal((1, 4), dtype=np.float32)
        s.step(q, k, k)
        resident.append(s.pages_resident)
    assert max(resident) == 4  # ceil(32 / 16) + 1 + 1 sink page, reached and never exceeded
    assert s.manager.evictions["lossy"] == 0
    assert s.pages_evicted == 59  # pages 1..59 of 0..62; sink page 0 and pages 60..62 remain
    assert s.tokens_attended == 32 + 4


@pytest.mark.parametrize(
    ("window", "sinks", "max_pages"),
    [
        (None, 0, 8),
        (6, 0, 8),
        (7, 3, 8),
        (None, 2, 3),
        (9, 1, 2),
    ],
)
def test_step_matches_reference_over_visible_tokens(
    window: int | None, sinks: int, max_pages: int
) -> None:
    s = KVStream(
        H, HKV, D, page_size=4, max_pages=max_pages, sliding_window=window, num_sink_tokens=sinks
    )
    rng = np.random.default_rng(3)
    keys, values = [], []
    for p in range(23):
        q, k, v = _token(rng)
        keys.append(k)
        values.append(v)
        out = s.step(q, k, v)
        pos = s.attended_positions()
        expected_pos = [j for j in range(p + 1) if (window is None or j > p - window) or j < sinks]
        if max_pages * 4 >= (window or 10**9) + 4 + sinks:
            assert pos.tolist() == expected_pos  # no lossy eviction: exactly the window
        ref = reference_attention(
            q[None],
            np.stack(keys)[pos],
            np.stack(values)[pos],
            scale=1 / np.sqrt(D),
            causal=False,
        )
        assert out.shape == (H, D) and out.dtype == np.float32
        np.testing.assert_allclose(out, ref[0], atol=1e-5, rtol=0)


def test_bad_shapes_raise() -> None:
    s = KVStream(H, HKV, D)
    q, k, v = _token(np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"\(num_heads, head_dim\)"):
        s.step(q[:1], k, v)
    with pytest.raises(ValueError, match="float32"):
        s.step(q, k.astype(np.float64), v)
    with pytest.raises(ValueError, match="multiple"):
        KVStream(3, 2, D)
