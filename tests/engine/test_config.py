"""CacheConfig / SchedulerConfig / EngineConfig validate on construction."""

from __future__ import annotations

import pytest
from tests.model.tiny import tiny_config

from pagedattn.config import CacheConfig, EngineConfig, SchedulerConfig


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"page_size": 0}, "page_size"),
        ({"num_pages": 0}, "num_pages"),
        ({"kv_cache_mib": 0.0}, "kv_cache_mib"),
        ({"sliding_window": 0}, "sliding_window"),
        ({"num_sink_tokens": -1}, "num_sink_tokens"),
        ({"num_sink_tokens": 4}, "num_sink_tokens"),  # sinks need a window
        ({"position_mode": "relative"}, "position_mode"),
        ({"position_mode": "shifted"}, "position_mode"),  # shifted needs a window
        ({"kv_cache_dtype": "bfloat16"}, "kv_cache_dtype"),
    ],
)
def test_cache_config_rejects(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        CacheConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
        ({"max_model_len": 0}, "max_model_len"),
    ],
)
def test_scheduler_config_rejects(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SchedulerConfig(**kwargs)  # type: ignore[arg-type]


def test_engine_config_and_kv_budget() -> None:
    with pytest.raises(ValueError, match="seed"):
        EngineConfig(seed=-1)
    with pytest.raises(ValueError, match="cache"):
        EngineConfig(cache=SchedulerConfig())  # type: ignore[arg-type]
    model = tiny_config()  # 2 layers, 2 kv heads, head_dim 16: 2*2*2*16*16*4 = 8192 B a page
    assert CacheConfig(page_size=16, kv_cache_mib=1.0).resolve_num_pages(model) == 128
    assert CacheConfig(num_pages=7, kv_cache_mib=1.0).resolve_num_pages(model) == 7
    half = CacheConfig(page_size=16, kv_cache_mib=1.0, kv_cache_dtype="float16")
    assert half.resolve_num_pages(model) == 256  # 2 bytes an element: 4096 B a page
    with pytest.raises(ValueError, match=r"kv_cache_dtype 'float16': the numpy backend only"):
        EngineConfig(backend="torch", cache=half)
    int8 = CacheConfig(page_size=16, kv_cache_mib=1.0, kv_cache_dtype="int8")
    # 1 byte a code plus a 4-byte scale per 16-code row: 2*2*2*16*(16+4) = 2560 B a page
    assert int8.resolve_num_pages(model) == 2**20 // 2560 == 409
    with pytest.raises(ValueError, match=r"kv_cache_dtype 'int8': the numpy backend only"):
        EngineConfig(backend="torch", cache=int8)
    with pytest.raises(ValueError, match="holds no page"):
        CacheConfig(kv_cache_mib=0.001).resolve_num_pages(model)
    cfg = CacheConfig(sliding_window=8, num_sink_tokens=4, position_mode="shifted")
    assert cfg.position_mode == "shifted"
