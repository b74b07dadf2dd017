"""KVStream on every backend: the same outputs as the NumPy stream (1e-5) through a window,
sinks and lossy eviction; saved on one backend, loaded on another; errors name the field."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.backends import BackendError
from pagedattn.backends.arrays import to_host
from pagedattn.kernels import reference_attention
from pagedattn.stream.kv_stream import KVStream
from tests.kernels.impls import skip_reason

H, HKV, D = 6, 2, 8
# window 10 + 3 sinks over pages of 4: with 5 pages, pages leave as the window passes; with 4
# the pool runs short first and the stream drops its oldest non-sink page (lossy).
CONFIG = {"page_size": 4, "max_pages": 5, "sliding_window": 10, "num_sink_tokens": 3}
EVICTIONS = {"sliding_window": CONFIG, "lossy": CONFIG | {"max_pages": 4}}


def _backend(name: str, device: str) -> object:
    reason = skip_reason(name, device)
    return pytest.param(
        name,
        device,
        id=f"{name}-{device}",
        marks=[pytest.mark.skip(reason=reason)] if reason else [],
    )


BACKENDS = [_backend("torch", "cpu"), _backend("torch", "cuda"), _backend("cupy", "cuda")]


def _tokens(n: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (
            rng.standard_normal((H, D), dtype=np.float32),
            rng.standard_normal((HKV, D), dtype=np.float32),
            rng.standard_normal((HKV, D), dtype=np.float32),
        )
        for _ in range(n)
    ]


@pytest.mark.parametrize(("name", "device"), BACKENDS)
@pytest.mark.parametrize("eviction", list(EVICTIONS))
def test_backend_stream_equals_numpy_stream_and_the_oracle(
    name: str, device: str, eviction: str
) -> None:
    config = EVICTIONS[eviction]
    ref = KVStream(H, HKV, D, **config)  # type: ignore[arg-type]
    dev = KVStream(H, HKV, D, **config, backend=name, device=device)  # type: ignore[arg-type]
    tokens = _tokens(60)
    for p, (q, k, v) in enumerate(tokens):
        expected = ref.step(q, k, v)
        out = dev.step(q, k, v)
        assert type(out).__module__.split(".")[0] == name  # stays a torch / cupy array
        np.testing.assert_allclose(to_host(out), expected, atol=1e-5, rtol=1e-5)
        assert dev.page_table == ref.page_table
        # Oracle: dense attention over exactly the keys the stream still attends.
        seen = dev.attended_positions()
        ks = np.stack([tokens[j][1] for j in seen])
        vs = np.stack([tokens[j][2] for j in seen])
        dense = reference_attention(q[None], ks, vs, causal=False)[0]
        np.testing.assert_allclose(to_host(out), dense, atol=1e-5, rtol=1e-5, err_msg=str(p))
    assert dev.manager.evictions[eviction] > 0
    assert dev.manager.evictions == ref.manager.evictions


@pytest.mark.parametrize(("name", "device"), BACKENDS)
@pytest.mark.parametrize("direction", ["numpy->backend", "backend->numpy"])
def test_save_on_one_backend_load_on_another(
    tmp_path, name: str, device: str, direction: str
) -> None:  # type: ignore[no-untyped-def]
    numpy_kw: dict[str, object] = {"backend": "numpy"}
    other_kw: dict[str, object] = {"backend": name, "device": device}
    src_kw, dst_kw = (numpy_kw, other_kw) if direction == "numpy->backend" else (other_kw, numpy_kw)
    tokens = _tokens(45, seed=1)
    src = KVStream(H, HKV, D, **CONFIG, **src_kw)  # type: ignore[arg-type]
    for t in tokens[:30]:
        src.step(*t)
    src.save(tmp_path / "s.kv")
    dst = KVStream(H, HKV, D, **CONFIG, **dst_kw)  # type: ignore[arg-type]
    dst.load(tmp_path / "s.kv")
    assert dst.page_table == src.page_table and dst.num_tokens == 30
    for page_id, _, _ in src.resident_pages():  # restored KV is bitwise the written KV
        np.testing.assert_array_equal(dst.pool.read_page(page_id), src.pool.read_page(page_id))
    for t in tokens[30:]:
        np.testing.assert_allclose(to_host(dst.step(*t)), to_host(src.step(*t)), atol=1e-5)


def test_torch_stream_takes_torch_or_numpy_inputs_and_names_bad_ones() -> None:
    torch = pytest.importorskip("torch")
    s = KVStream(H, HKV, D, **CONFIG, backend="torch")  # type: ignore[arg-type]
    (q, k, v), (q2, k2, v2) = _tokens(2)
    s.step(torch.from_numpy(q), torch.from_numpy(k), v)
    ref = KVStream(H, HKV, D, **CONFIG)  # type: ignore[arg-type]
    ref.step(q, k, v)
    out = s.step(torch.from_numpy(q2), torch.from_numpy(k2), torch.from_numpy(v2))
    np.testing.assert_allclose(out.numpy(), ref.step(q2, k2, v2), atol=1e-5)
    with pytest.raises(ValueError, match=r"k: expected float32 \(num_kv_heads, head_dim\)"):
        s.step(q, torch.zeros(HKV, D, dtype=torch.float64), v)
    with pytest.raises(ValueError, match=r"q: expected float32 \(num_heads, head_dim\) = \(6, 8\)"):
        s.step(np.zeros((H, D + 1), np.float32), k, v)
    with pytest.raises(ValueError, match="v: expected a float32"):
        s.step(q, k, v.tolist())


def test_cupy_stream_moves_host_inputs_to_the_device() -> None:
    reason = skip_reason("cupy", "cuda")
    if reason:
        pytest.skip(reason)
    import cupy

    s = KVStream(H, HKV, D, **CONFIG, backend="cupy")  # type: ignore[arg-type]
    ref = KVStream(H, HKV, D, **CONFIG)  # type: ignore[arg-type]
    assert isinstance(s.pool.kv, cupy.ndarray)
    for q, k, v in _tokens(20):
        out = s.step(q, cupy.asarray(k), v)  # host and device inputs mixed
        assert isinstance(out, cupy.ndarray)
        np.testing.assert_allclose(out.get(), ref.step(q, k, v), atol=1e-5)


@pytest.mark.parametrize(("name", "device"), [("numpy", "cuda"), ("cupy", "cpu"), ("jax", None)])
def test_invalid_backend_is_a_one_line_error(name: str, device: str | None) -> None:
    with pytest.raises(BackendError) as info:
        KVStream(H, HKV, D, backend=name, device=device)
    assert "\n" not in str(info.value)
