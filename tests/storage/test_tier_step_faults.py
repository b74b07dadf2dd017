"""A persistent tier that raises inside a step: a lookup or restore error is a counted miss
(the request computes those pages), a write-through error loses only the stored copy, and an
interrupt during a restore leaks no page. Every request answers as a store-less engine does."""

from __future__ import annotations

import errno
import pathlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pagedattn.config import CacheConfig, EngineConfig
from pagedattn.engine.llm_engine import LLMEngine
from pagedattn.sampling_params import SamplingParams
from tests.engine.helpers import assert_all_pages_free, drain, tiny_model, tokens

PS = 4
MODEL = tiny_model(seed=9)
_rng = np.random.default_rng(31)
STORED = [int(t) for t in _rng.integers(3, 250, 21)]  # 5 full pages the store holds
OTHERS = [[int(t) for t in _rng.integers(3, 250, n)] for n in (7, 11)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def _engine(store: Path | None) -> LLMEngine:
    kv_store = None if store is None else str(store)
    config = EngineConfig(cache=CacheConfig(page_size=PS, num_pages=64), kv_store=kv_store)
    return LLMEngine(config, MODEL, model_fingerprint="tiny-9")


def _clean(prompt: list[int]) -> list[int]:
    return tokens(drain(_engine(None), {0: [("c", prompt, GREEDY)]})["c"])


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A disk store holding STORED's full pages."""
    writer = _engine(tmp_path)
    drain(writer, {0: [("w", STORED, GREEDY)]})
    writer.close()
    return tmp_path


def _requests() -> dict[int, list[tuple[str, list[int], SamplingParams]]]:
    return {0: [("o0", OTHERS[0], GREEDY)], 1: [("s", STORED, GREEDY), ("o1", OTHERS[1], GREEDY)]}


def _assert_clean_answers(outs: dict[str, list[Any]]) -> None:
    for rid, prompt in (("s", STORED), ("o0", OTHERS[0]), ("o1", OTHERS[1])):
        assert outs[rid][-1].error is None, rid
        assert tokens(outs[rid]) == _clean(prompt), rid


def test_a_store_read_error_during_lookup_is_a_counted_miss(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_is_file = pathlib.Path.is_file

    def is_file(self: pathlib.Path) -> bool:
        if store in self.parents:
            raise OSError(errno.EIO, "injected: input/output error", str(self))
        return real_is_file(self)

    engine = _engine(store)
    monkeypatch.setattr(pathlib.Path, "is_file", is_file)
    outs = drain(engine, _requests())
    _assert_clean_answers(outs)
    assert outs["s"][-1].num_cached_tokens == 0  # nothing restored: a miss
    stats = engine.get_stats()
    assert stats["tier_errors"]["lookup"] >= 1 and stats["tier_restored_tokens"] == 0
    assert stats["num_finished"] == {"length": 3}
    assert_all_pages_free(engine)
    monkeypatch.undo()  # the store reads again: the pages are restored
    again = drain(_engine(store), {0: [("s", STORED, GREEDY)]})["s"]
    assert tokens(again) == _clean(STORED) and again[-1].num_cached_tokens == 20


def test_a_restore_that_fails_midway_keeps_the_pages_before_it(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _engine(store)
    tier = engine.kv_tier
    assert tier is not None
    real_load, loads = tier.load, []

    def load(page_id: int, kv: np.ndarray) -> None:
        loads.append(page_id)
        if len(loads) == 3:
            raise MemoryError("injected: no memory for the page")
        real_load(page_id, kv)

    monkeypatch.setattr(tier, "load", load)
    outs = drain(engine, _requests())
    _assert_clean_answers(outs)
    assert outs["s"][-1].num_cached_tokens == 8  # the two pages loaded before the error
    assert engine.get_stats()["tier_errors"]["lookup"] == 1
    assert_all_pages_free(engine)


def test_an_interrupt_during_restore_leaks_no_page(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _engine(store)
    drain(engine, {0: [("head", STORED[:9], GREEDY)]})  # pages 0-1 now hit in memory
    tier = engine.kv_tier
    assert tier is not None
    real_load = tier.load

    def load(page_id: int, kv: np.ndarray) -> None:  # copying the records into the pool
        monkeypatch.setattr(tier, "load", real_load)  # once
        raise KeyboardInterrupt

    monkeypatch.setattr(tier, "load", load)
    engine.add_request(STORED, GREEDY, request_id="s")
    with pytest.raises(KeyboardInterrupt):  # the step that admits it, once its KV is read
        for _ in range(10_000):
            engine.step()
    assert_all_pages_free(engine)  # the touched hits were released, nothing is referenced
    outs = drain(engine, {0: [("o0", OTHERS[0], GREEDY)]})
    assert tokens(outs["s"]) == _clean(STORED) and outs["s"][-1].num_cached_tokens == 20
    assert tokens(outs["o0"]) == _clean(OTHERS[0])
    assert_all_pages_free(engine)


def test_a_write_through_error_loses_only_the_stored_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _engine(tmp_path)
    tier = engine.kv_tier
    assert tier is not None

    def write(page_ids: Any, keys: Any) -> None:
        raise OSError(errno.ENOSPC, "injected: no space left on device")

    monkeypatch.setattr(tier, "write", write)
    outs = drain(engine, _requests())
    _assert_clean_answers(outs)
    assert engine.get_stats()["tier_errors"]["write"] > 0
    assert_all_pages_free(engine)
    # the pages are still served from memory
    again = drain(engine, {0: [("s2", STORED, GREEDY)]})["s2"]
    assert tokens(again) == _clean(STORED) and again[-1].num_cached_tokens == 20
