"""The persistent KV tier (a --kv-store directory) with the page pool on torch: pages written
from a torch pool are restored bitwise onto a fresh torch pool, the restored request
generates what a cold one does, and a NumPy engine restores the same records."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pagedattn.backends import BackendSpec
from pagedattn.cache.hashing import prefix_page_hashes
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.sampling_params import SamplingParams
from tests.backends.helpers import engine_on, tiny_on
from tests.engine.helpers import drain, tokens

PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPT = np.random.default_rng(5).integers(3, 250, 37).tolist()  # 9 full pages of 4


def _run(engine: LLMEngine) -> tuple[list[int], int]:
    outs = drain(engine, {0: [("r", PROMPT, PARAMS)]})["r"]
    return tokens(outs), outs[-1].num_cached_tokens


def _pages(engine: LLMEngine) -> list[np.ndarray]:
    hashes = prefix_page_hashes(PROMPT, 4, engine.namespace)
    allocator = engine.cache_manager.allocator
    return [engine.page_pool.read_page(allocator.page_of(h)) for h in hashes]


def test_pages_round_trip_through_the_disk_tier_on_torch(
    torch_backend: BackendSpec, tmp_path: Path
) -> None:
    model = tiny_on(torch_backend)
    options = {"page_size": 4, "num_pages": 64, "kv_store": str(tmp_path)}
    cold, cached = _run(engine_on(torch_backend, model, page_size=4, num_pages=64))
    writer = engine_on(torch_backend, model, **options)
    assert _run(writer) == (cold, 0)
    written = _pages(writer)
    writer.close()
    assert len(written) == 9

    reader = engine_on(torch_backend, model, **options)  # a restart: empty pool, same store
    assert _run(reader) == (cold, 36)
    assert reader.get_stats()["tier_restored_tokens"] == 36
    assert reader.get_stats()["kv_store"]["errors"] == {}
    restored = _pages(reader)
    assert type(reader.page_pool.kv).__module__ == "torch"
    for got, want in zip(restored, written, strict=True):
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
    reader.close()

    numpy_spec = BackendSpec("numpy", "cpu")  # the records are backend-free host arrays
    numpy_reader = engine_on(numpy_spec, tiny_on(numpy_spec), **options)
    answer, cached = _run(numpy_reader)
    assert cached == 36 and answer == cold
    numpy_reader.close()
