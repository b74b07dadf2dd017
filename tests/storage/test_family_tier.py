"""The persistent tier (a disk store) on the Qwen 2 and Gemma 3 families: an engine writes a
prompt's pages; after a restart (a fresh engine and a freshly loaded model on the same folder)
the same prompt restores them from the store, which was read (its counters), and answers as a
cold run with no store and as HF transformers do, with the restored pages' KV bit-identical."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pagedattn.cache.hashing import prefix_page_hashes
from pagedattn.config import CacheConfig, EngineConfig
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.model.decoder import DecoderModel
from pagedattn.model.loader import load_model
from pagedattn.sampling_params import SamplingParams
from tests.engine.helpers import drain, tokens
from tests.model.conftest import hf_greedy
from tests.model.families import WINDOW, gguf_with_oracle

pytestmark = pytest.mark.hf
PS = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPT = [int(t) for t in np.random.default_rng(3).integers(3, 272, 4 * WINDOW + 5)]  # 37


@pytest.fixture(scope="module", params=["qwen2", "gemma3"])
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return gguf_with_oracle(request.param, tmp_path_factory.mktemp(request.param))


def _engine(path: Path, kv_store: str | None) -> LLMEngine:
    """A fresh engine on a freshly loaded model (what a restarted process builds)."""
    loaded = load_model(path)
    config = EngineConfig(cache=CacheConfig(page_size=PS, num_pages=64), kv_store=kv_store)
    return LLMEngine(config, DecoderModel.from_loaded(loaded), loaded.tokenizer)


def _run(engine: LLMEngine) -> tuple[list[int], int]:
    outs = drain(engine, {0: [("r", PROMPT, GREEDY)]})["r"]
    return tokens(outs), outs[-1].num_cached_tokens


def _page_kv(engine: LLMEngine, page_hash: bytes) -> bytes:
    page_id = engine.cache_manager.allocator.page_of(page_hash)
    return bytes(engine.page_pool.kv[:, :, page_id].tobytes())


def test_restart_restores_the_stored_pages_and_answers_as_a_cold_run(
    family: tuple[Any, Path], tmp_path: Path
) -> None:
    hf, path = family
    cold, cached = _run(_engine(path, None))
    assert cached == 0 and cold == hf_greedy(hf, PROMPT, 6)

    writer = _engine(path, str(tmp_path))
    assert _run(writer) == (cold, 0)
    writer.kv_tier.flush()  # type: ignore[union-attr]
    # 37 prompt + 5 fed-back generated tokens = 42 computed: 10 full pages
    assert writer.get_stats()["kv_store"]["pages_written"] == 10
    hashes = prefix_page_hashes(PROMPT, PS, writer.namespace)
    written = [_page_kv(writer, h) for h in hashes]
    writer.close()

    reader = _engine(path, str(tmp_path))  # the restart
    assert reader.namespace == writer.namespace  # the same weights name the same pages
    answer, cached = _run(reader)
    assert answer == cold
    assert cached == 36  # 9 full prompt pages (the last prompt token is always computed)
    stats = reader.get_stats()
    assert stats["tier_restored_tokens"] == 36
    assert stats["kv_store"]["pages_hit"] >= 9 and stats["kv_store"]["bytes_read"] > 0
    assert stats["kv_store"]["errors"] == {}
    assert [_page_kv(reader, h) for h in hashes] == written  # bit-identical KV
    reader.cache_manager.check_integrity()
    reader.close()
